// The steps both sm90 attention kernels (attention.cuh: producer and consumers; inline_loads.cuh: one warpgroup
// that loads for itself) take per tile and KV block: the wgmma issues of S = Q K^T and of P~ V, the TMA loads of
// Q_i, K_j and V_j, the walk over the visited blocks, and a consumer's state at the start of a tile.
#pragma once

#include "sage/device/sm90/accumulation.cuh"
#include "sage/device/sm90/block_sparse.cuh"
#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/mbarrier.cuh"
#include "sage/device/sm90/softmax.cuh"
#include "sage/device/sm90/tiles.cuh"
#include "sage/device/sm90/tma.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

namespace sage::device::sm90 {

// Issues S = Q_i K_j^T for this consumer's 64 rows as one wgmma group: one wgmma per k step (32 bytes of a row),
// both operands in shared memory. The caller waits (wgmma_wait_group) and fences the accumulator before reading it.
template <class Config, class Accumulator>
__device__ __forceinline__ void issue_q_k(Accumulator (&accumulator)[Config::kBlockKv / 2], unsigned q_tile,
                                          unsigned k_tile) {
  using Layout = SharedLayout<Config>;
  constexpr unsigned kCoreGroupBytes = 8 * Layout::kQkChunkBytes; // 8 rows: the next core matrices along M/N
  constexpr unsigned long long kFixed =
      matrix_descriptor(0, 16, kCoreGroupBytes, swizzle_of_rows<Layout::kQkChunkBytes>());
  constexpr int kSteps = Layout::kQkRowBytes / 32;
  const unsigned long long q_descriptor = descriptor_at(kFixed, q_tile), k_descriptor = descriptor_at(kFixed, k_tile);
  warpgroup_fence_operands(accumulator);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int chunk = step * 32 / Layout::kQkChunkBytes, within = step * 32 % Layout::kQkChunkBytes;
    const unsigned long long a = q_descriptor + (chunk * Layout::kQChunkStride + within) / 16;
    const unsigned long long b = k_descriptor + (chunk * Layout::kKChunkStride + within) / 16;
    if constexpr (Config::kQk == QkOperands::int8)
      WgmmaS8SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
    else if constexpr (Config::kQk == QkOperands::f16)
      WgmmaF16SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
    else
      WgmmaBf16SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
  }
  wgmma_commit_group();
}

// Issues O (+)= P~ V_j for kSlices column slices of V (ValueSlices) from `first_slice` on as one wgmma group: one
// wgmma per slice and k step of P~; `output` holds those slices' accumulators in order. `accumulate` = 0 restarts
// them. P~'s registers and `output` must not be touched until the group has completed.
template <class Config, int kSlices, class Accumulator, int kCount>
__device__ __forceinline__ void issue_p_v(Accumulator (&output)[kCount], const ProbabilityFragments<Config> &p,
                                          unsigned v_tile, bool accumulate, int first_slice = 0) {
  using Layout = SharedLayout<Config>;
  using Fragments = ProbabilityFragments<Config>;
  constexpr int kN = ValueSlices<Config>::kChannels;
  constexpr int kSliceRegisters = kCount / kSlices;
  warpgroup_fence_operands(output);
  wgmma_fence();
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
    Accumulator(&d)[kSliceRegisters] =
        *reinterpret_cast<Accumulator(*)[kSliceRegisters]>(output + slice * kSliceRegisters);
    const int channel = (first_slice + slice) * kN; // the slice's first column of O
#pragma unroll
    for (int step = 0; step < Fragments::kSteps; ++step) {
      const int scale_d = accumulate || step > 0;
      if constexpr (Layout::kTransposedV) {
        // V^T [channels][tokens], K-major: step s reads tokens 32s .. 32s + 31 of the slice's channel rows.
        constexpr unsigned long long kFixed =
            matrix_descriptor(0, 16, 8 * Layout::kVChunkBytes, swizzle_of_rows<Layout::kVChunkBytes>());
        const int chunk = step * 32 / Layout::kVChunkBytes, within = step * 32 % Layout::kVChunkBytes;
        const unsigned long long b = descriptor_at(kFixed, v_tile) +
                                     (chunk * Layout::kVChunkStride + within + channel * Layout::kVChunkBytes) / 16;
        if constexpr (Config::kPv == PvOperands::e4m3)
          WgmmaE4m3RS<kN>::run(d, p.registers[step], b, scale_d);
        else
          WgmmaS8RS<kN>::run(d, p.registers[step], b, scale_d);
      } else {
        // V [tokens][channels], MN-major: step s starts 16 token rows further; channel chunks (64 channels, one
        // swizzle atom) are LBO apart, and a slice starts at a whole chunk.
        constexpr unsigned long long kFixed = matrix_descriptor(0, Layout::kVChunkStride, 8 * Layout::kVChunkBytes,
                                                                swizzle_of_rows<Layout::kVChunkBytes>());
        const unsigned long long b =
            descriptor_at(kFixed, v_tile) +
            (step * 16 * Layout::kVChunkBytes + channel * 2 / Layout::kVChunkBytes * Layout::kVChunkStride) / 16;
        if constexpr (Config::kPv == PvOperands::f16_accumulate_f16)
          WgmmaF16RSF16<kN>::run(d, p.registers[step], b, scale_d);
        else
          WgmmaF16RSF32<kN>::run(d, p.registers[step], b, scale_d);
      }
    }
  }
  wgmma_commit_group();
}

// P~_i^j V_j as one wgmma group: int8 into the block's s32 product (restarted), else into O (restarted on the tile's
// first block). With a sliced fold (ConsumerState::kSlicedFold) only column slice `slice`, into the one slice's
// accumulator; otherwise every slice.
template <class Config, int kProductRegisters>
__device__ __forceinline__ void issue_block_p_v(ConsumerState<Config> &state, int (&block_product)[kProductRegisters],
                                                const ProbabilityFragments<Config> &p, unsigned v_tile, int slice = 0) {
  constexpr int kSlices = ConsumerState<Config>::kSlicedFold ? 1 : ValueSlices<Config>::kCount;
  if constexpr (Config::kPv == PvOperands::int8)
    issue_p_v<Config, kSlices>(block_product, p, v_tile, false, slice);
  else
    issue_p_v<Config, kSlices>(state.output, p, v_tile, accumulates(state), slice);
}

// Once issue_block_p_v's group has completed: the asynchronous wgmma read P~'s registers and wrote the product (or O)
// until now (the asm statement that issued it was their last visible use), so fence them.
template <class Config, int kProductRegisters>
__device__ __forceinline__ void fence_p_v_registers(ConsumerState<Config> &state,
                                                    int (&block_product)[kProductRegisters],
                                                    ProbabilityFragments<Config> &p) {
#pragma unroll
  for (int step = 0; step < ProbabilityFragments<Config>::kSteps; ++step)
    warpgroup_fence_operands(p.registers[step]);
  if constexpr (Config::kPv == PvOperands::int8)
    warpgroup_fence_operands(block_product);
  else
    warpgroup_fence_operands(state.output);
}

// The KV blocks a CTA visits, in order: every block of [0, block_end), or (block-sparse) the kept ones of its mask
// row. Dense kernels compile to the plain `++block` loop.
template <class Config> struct VisitedBlocks {
  KeptBlocks kept; // block-sparse only
  int block_end;
  // The first visited block >= `block`, or block_end
  __device__ __forceinline__ int next(int block) const {
    if constexpr (Config::kBlockSparse)
      return kept.next(block);
    else
      return block;
  }
};

// Q_i's TMA load, issued by one thread as soon as the barriers exist (before a block-sparse CTA reads its mask row).
template <class Config>
__device__ __forceinline__ void load_q(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                       unsigned shared_base, const StageBarriers<Config> &barriers) {
  using Layout = SharedLayout<Config>;
  mbarrier_arrive_expect_tx(barriers.q_full(), Layout::kQBytes);
  const int q_row = static_cast<int>(tile.q_head_index * params.base.size.padded_q + tile.q_begin);
#pragma unroll
  for (int chunk = 0; chunk < Layout::kQkChunks; ++chunk)
    tma_load_2d(shared_base + Layout::kQOffset + chunk * Layout::kQChunkStride, &params.q_map, barriers.q_full(),
                chunk * Layout::kQkChunkBytes, q_row);
}

// K_j's and V_j's TMA loads into a stage (one thread; the stage is free): each announces its bytes on the stage's
// full barrier.
template <class Config>
__device__ __forceinline__ void load_k(const SageSm90AttentionParams &params, const TileCoordinates &tile, int block,
                                       unsigned stage_base, unsigned full_k) {
  using Layout = SharedLayout<Config>;
  const int k_row = static_cast<int>(tile.kv_head_index * params.base.size.padded_kv + block * Config::kBlockKv);
  mbarrier_arrive_expect_tx(full_k, Layout::kKBytes);
#pragma unroll
  for (int chunk = 0; chunk < Layout::kQkChunks; ++chunk)
    tma_load_2d(stage_base + Layout::kKOffset + chunk * Layout::kKChunkStride, &params.k_map, full_k,
                chunk * Layout::kQkChunkBytes, k_row);
}
template <class Config>
__device__ __forceinline__ void load_v(const SageSm90AttentionParams &params, const TileCoordinates &tile, int block,
                                       unsigned stage_base, unsigned full_v) {
  using Layout = SharedLayout<Config>;
  const int kv_begin = block * Config::kBlockKv;
  const int k_row = static_cast<int>(tile.kv_head_index * params.base.size.padded_kv + kv_begin);
  mbarrier_arrive_expect_tx(full_v, Layout::kVBytes);
#pragma unroll
  for (int chunk = 0; chunk < Layout::kVChunks; ++chunk) {
    const unsigned destination = stage_base + Layout::kVOffset + chunk * Layout::kVChunkStride;
    if constexpr (Config::kValues == ValueTiles::workspace_codes) // [b * h_kv * d rows][padded_kv bytes]
      tma_load_2d(destination, &params.v_map, full_v, kv_begin + chunk * Layout::kVChunkBytes,
                  static_cast<int>(tile.kv_head_index * Config::kHeadDim));
    else if constexpr (Config::kValues == ValueTiles::workspace_values) // [b * h_kv * padded_kv rows][2d bytes]
      tma_load_2d(destination, &params.v_map, full_v, chunk * Layout::kVChunkBytes, k_row);
    else if constexpr (!Config::kPackedSequences) // the caller's V: [b][h_kv][tokens_kv][2d bytes], any strides
      tma_load_4d(destination, &params.v_map, full_v, chunk * Layout::kVChunkBytes, kv_begin, tile.kv_head, tile.batch);
    else // the caller's packed V: [1][h_kv][total_kv][2d bytes]; keys past the sequence are masked (P~ = 0)
      tma_load_4d(destination, &params.v_map, full_v, chunk * Layout::kVChunkBytes, tile.kv_base + kv_begin,
                  tile.kv_head, 0);
  }
}

// A consumer thread's state before a tile's first block: its rows' factors (delta_Q x the base-2 factor), m = -inf,
// l = 0 and the outer sum zeroed.
template <class Config>
__device__ __forceinline__ void start_consumer(ConsumerState<Config> &state, const SageAttentionParams &base,
                                               const TileCoordinates &tile, const int (&rows)[2]) {
  const SageProblemSize &size = base.size;
  float q_row_scale[2] = {1.0f, 1.0f};
  if constexpr (Config::kQk == QkOperands::int8) {
    const float *q_scales = reinterpret_cast<const float *>(base.workspace + base.offsets.q_scales) +
                            tile.q_head_index * size.q_scale_count;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int group = scale_group<Config::kQScaleTokensPerGroup, Config::kQScaleInterleave>(rows[half]);
      group = group < size.q_scale_count ? group : size.q_scale_count - 1; // rows past the padded sequence
      q_row_scale[half] = q_scales[group];
    }
  }
  const float domain_factor =
      Config::kDomainFactorFromParams ? base.softmax_scale * Config::kLog2e : Config::kDomainFactor;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.row_factor[half] = q_row_scale[half] * domain_factor;
    state.row_max[half] = negative_infinity();
    state.row_sum[half] = 0.0f;
  }
  // `output` is not zeroed: the tile's first P.V restarts it (scale-d 0). A persistent CTA's loop would otherwise
  // define wgmma accumulator registers between two tiles' wgmma, and ptxas then serializes every wgmma (C7515).
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(state.flushed) / sizeof(float)); ++i)
    state.flushed[i] = 0.0f;
  state.blocks_since_flush = 0;
}

// Blocks from the returned one on cross the sequence's end or (causal) the diagonal of the consumer's first row.
template <class Config>
__device__ __forceinline__ int unmasked_block_end(const TileCoordinates &tile, int consumer_row) {
  int unmasked_end = tile.tokens_kv / Config::kBlockKv;
  if constexpr (Config::kCausal) {
    const int diagonal_limit = consumer_row + tile.causal_offset + 1;
    unmasked_end = diagonal_limit <= 0 ? 0 : min(unmasked_end, diagonal_limit / Config::kBlockKv);
  }
  return unmasked_end;
}

} // namespace sage::device::sm90
