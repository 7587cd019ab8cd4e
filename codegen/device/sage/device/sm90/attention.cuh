// The sm90 attention kernel: SageAttention's quantized attention on Hopper's warpgroup MMA, fed by TMA through an
// mbarrier pipeline, with warp specialisation (the FlashAttention-3 recipe).
//
//   warpgroup 0      producer: one thread issues the TMA loads of Q_i (once) and of K_j, V_j into kStages
//                    shared-memory stages; it gives most of its registers to the consumers (setmaxnreg).
//   warpgroups 1..C  consumers: each owns 64 rows of Q_i. Per KV block j:
//                      S = Q_i K_j^T                 wgmma, A and B from shared memory (s8 or f16/bf16)
//                      S = psi^-1(S) in base 2       delta_Q per row, delta_K per column
//                      m, P~ = exp2(S - m), l        online softmax, P~ never leaves the registers
//                      O = diag(exp2(m' - m)) O + P~ V_j   wgmma, A = P~ from registers, B = V_j from shared memory
//                    and release the stage to the producer.
//
// The generator instantiates attention_kernel<Config> with a Config struct of constants (see the generated
// source); everything a variant decides is a constant there, so the compiler removes the unused paths.
//
// 8-bit P.V: the S accumulator gives a thread columns 8j + 2t, 8j + 2t + 1 while the A operand of an 8-bit wgmma
// wants 4 consecutive k. P~ is packed without moving data (columns 8j + 2t.. of tiles 4s, 4s + 1 form k = 4t..4t + 3
// of step s), and the prologue wrote V^T with its tokens in the matching order (VCodesTokenOrder::wgmma_interleaved).
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

// The producer's loads of one tile: K_j and V_j for every visited block j into stage (position % kStages), each as
// soon as the consumers released that stage's K or V. `position` counts the CTA's visited blocks over all its tiles.
template <class Config>
__device__ __forceinline__ void produce_tile(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                             const VisitedBlocks<Config> &visits, unsigned shared_base,
                                             const StageBarriers<Config> &barriers, int &position) {
  using Layout = SharedLayout<Config>;
  for (int block = visits.next(0); block < visits.block_end; block = visits.next(block + 1), ++position) {
    // A fresh barrier passes parity 1: the first kStages loads go straight out.
    const unsigned released = StageBarriers<Config>::phase(position) ^ 1u;
    const unsigned stage_base = shared_base + Layout::kStageOffset + (position % Config::kStages) * Layout::kStageBytes;
    mbarrier_wait_suspended(barriers.empty_k(position), released);
    load_k<Config>(params, tile, block, stage_base, barriers.full_k(position));
    mbarrier_wait_suspended(barriers.empty_v(position), released);
    load_v<Config>(params, tile, block, stage_base, barriers.full_v(position));
  }
}

// The producer of a persistent CTA: it claims its tiles one ahead (the next while it loads this one). For each, once
// the consumers have read the previous tile's Q for the last time, it tells them both claims (the tile slot, published
// by tile_full, so that they set the tile up while Q_i is in flight), then loads Q_i and the tile's K/V stages (which
// may run ahead into the next tile's first blocks). tile_full's next phase waits for q_empty, so it never runs two
// phases ahead of a consumer's wait.
template <class Config>
__device__ __forceinline__ void produce(const SageSm90AttentionParams &params, const TileSchedule<Config> &schedule,
                                        unsigned shared_base, const StageBarriers<Config> &barriers) {
  using Layout = SharedLayout<Config>;
  int position = 0;
  int index = schedule.claim(params.tile_counter, params.base);
  for (int iteration = 0;; ++iteration) {
    const int next = index < schedule.tiles ? schedule.claim(params.tile_counter, params.base) : schedule.tiles;
    mbarrier_wait_suspended(barriers.q_empty(), StageBarriers<Config>::phase_of(iteration) ^ 1u);
    asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(shared_base + Layout::kTileSlotOffset), "r"(index),
                 "r"(next)
                 : "memory");
    mbarrier_arrive(shared_base + Layout::kTileFullOffset); // releases the slot's store
    if (index >= schedule.tiles)                            // no tile: the consumers read that and return
      return;
    const TileCoordinates tile = schedule.coordinates(index, params.base);
    load_q<Config>(params, tile, shared_base, barriers);
    VisitedBlocks<Config> visits{};
    visits.block_end = tile.block_end;
    produce_tile<Config>(params, tile, visits, shared_base, barriers, position);
    if (next >= schedule.tiles)
      return;
    index = next;
  }
}

// Two consumer warpgroups take turns at the tensor cores (ping-pong): each issues its wgmma between a sync on its
// own named barrier and an arrive on the other's, so one warpgroup's softmax runs while the other's GEMMs do.
template <class Config> struct TurnTaking {
  static constexpr bool kEnabled = Config::kConsumers == 2;
  static constexpr int kFirstBarrier = 1; // 0 is __syncthreads'
  int consumer;
  __device__ __forceinline__ void start() const {
    if constexpr (kEnabled)
      if (consumer == 1) // consumer 0 goes first
        named_barrier_arrive(kFirstBarrier, 2 * kWarpgroupThreads);
  }
  __device__ __forceinline__ void wait_turn() const {
    if constexpr (kEnabled)
      named_barrier_sync(kFirstBarrier + consumer, 2 * kWarpgroupThreads);
  }
  // `last`: consumer 1's final turn hands over to nobody (consumer 0 has no turn left to wait for).
  __device__ __forceinline__ void pass_turn(bool last) const {
    if constexpr (kEnabled)
      if (!(last && consumer == 1))
        named_barrier_arrive(kFirstBarrier + 1 - consumer, 2 * kWarpgroupThreads);
  }
};

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

// A consumer warpgroup's main loop, software-pipelined by one P.V: in step j it issues S_j = Q K_j^T and
// O += P~_(j-1) V_(j-1) back to back, then computes the softmax of S_j while the P.V runs (kSoftmaxUnderProduct; else
// after it, when the P.V's product and S_j would not both fit the registers), then packs P~_j.
// Every consumer visits the CTA's blocks (rows past a block's reach see it fully masked; block-sparse: the kept blocks
// of the CTA's one mask row), so the pipeline's phases and the ping-pong's turns match between consumers. `position`
// counts the tile's visited blocks, `first_position` the CTA's visited blocks before this tile (both pick the stage
// and the phase); `block` is the KV block at that position. `iteration`: the CTA's tiles before this one; `last`: this
// is its last tile. Returns the number of blocks visited.
template <class Config>
__device__ __forceinline__ int consume(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                       const VisitedBlocks<Config> &visits, unsigned shared_base,
                                       const StageBarriers<Config> &barriers, int consumer,
                                       const TurnTaking<Config> &turns, int first_position, int iteration, bool last) {
  static_assert(!ConsumerState<Config>::kSlicedFold,
                "an outer sum over column slices of O runs with inline loads (the schedule plans it so)");
  using Layout = SharedLayout<Config>;
  using Accumulator = Select<Config::kQk == QkOperands::int8, int, float>;
  const SageAttentionParams &base = params.base;
  const SageProblemSize &size = base.size;
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32, quad_lane = lane % 4;
  const int consumer_row = tile.q_begin + consumer * 64;
  const int rows[2] = {consumer_row + warp * 16 + lane / 4, consumer_row + warp * 16 + lane / 4 + 8};
  const unsigned char *workspace = base.workspace;

  ConsumerState<Config> state;
  start_consumer<Config>(state, base, tile, rows);
  const float *k_scales =
      reinterpret_cast<const float *>(workspace + base.offsets.k_scales) + tile.kv_head_index * size.k_scale_count;
  const int unmasked_end = unmasked_block_end<Config>(tile, consumer_row);
  const unsigned q_tile = shared_base + Layout::kQOffset + consumer * 64 * Layout::kQkChunkBytes;
  // Pipeline positions of this tile's blocks, counted over all of the CTA's tiles.
  auto stage_base = [&](int position) {
    return shared_base + Layout::kStageOffset + ((first_position + position) % Config::kStages) * Layout::kStageBytes;
  };
  auto full_k = [&](int position) { return barriers.full_k(first_position + position); };
  auto full_v = [&](int position) { return barriers.full_v(first_position + position); };
  auto phase = [&](int position) { return StageBarriers<Config>::phase(first_position + position); };
  // Q_i is read for the last time by the tile's last S (a persistent CTA's producer then loads the next tile's Q).
  auto release_q = [&] {
    if constexpr (Config::kPersistent)
      mbarrier_arrive(barriers.q_empty());
  };
  // The next visited block, broadcast from lane 0 so that ptxas sees the loop's trip count as warp-uniform (a wgmma
  // under a branch it considers divergent gets serialized: C7518).
  auto next_block = [&](int block) {
    if constexpr (Config::kBlockSparse)
      return __shfl_sync(0xffffffffu, visits.next(block), 0);
    else
      return block;
  };

  mbarrier_wait(barriers.q_full(), StageBarriers<Config>::phase_of(iteration)); // Q_i
  const int block_end = visits.block_end;
  Accumulator accumulator[Config::kBlockKv / 2];
  float scores[Config::kBlockKv / 2];
  float rescale[2];
  ProbabilityFragments<Config> p;
  int block_product[Config::kPv == PvOperands::int8 ? ConsumerState<Config>::kOutputChannels / 2 : 1];
  // S_j (waited for) -> P~_j's f32 scores, then P~_j packed once the previous P.V no longer reads P~'s registers.
  using BlockScales = typename CodesSoftmax<Config>::BlockScales;
  auto load_scales = [&](int block) {
    if constexpr (CodesSoftmax<Config>::kApplies)
      return CodesSoftmax<Config>::load(k_scales, size.k_scale_count, block * Config::kBlockKv);
    else
      return BlockScales{};
  };
  auto score = [&](int block, const BlockScales &block_scales) {
    const int kv_begin = block * Config::kBlockKv;
    if (block >= unmasked_end)
      score_block<Config, true>(state, scores, accumulator, size, tile, k_scales, block_scales, rows, kv_begin,
                                quad_lane, rescale);
    else
      score_block<Config, false>(state, scores, accumulator, size, tile, k_scales, block_scales, rows, kv_begin,
                                 quad_lane, rescale);
  };
  // O += P~_j V_j: rescale O to m_j, issue; the caller passes the turn and waits.
  auto issue_product = [&](int position) {
    rescale_output(state, rescale);
    const unsigned v_tile = stage_base(position) + Layout::kVOffset;
    issue_block_p_v<Config>(state, block_product, p, v_tile);
  };
  // After the P.V of block j completed: fence its registers; release V_j's stage; fold the product.
  auto fence_product = [&] { fence_p_v_registers<Config>(state, block_product, p); };
  auto finish_product = [&](int position) {
    mbarrier_arrive(barriers.empty_v(first_position + position)); // V_j is no longer read
    finish_block(state, block_product);
  };

  // The loop is peeled so that its body issues every wgmma unconditionally (ptxas serializes wgmma whose register
  // dependences it cannot follow through branches).
  const int first_block = next_block(0);
  int position = 1; // after the loop: the number of visited blocks (when there was one)
  if (first_block < block_end) {
    const BlockScales block_scales = load_scales(first_block);
    mbarrier_wait(full_k(0), phase(0));
    turns.wait_turn();
    issue_q_k<Config>(accumulator, q_tile, stage_base(0) + Layout::kKOffset);
    turns.pass_turn(false);
    const int second_block = next_block(first_block + 1);
    wgmma_wait_group<0>();
    warpgroup_fence_operands(accumulator);
    mbarrier_arrive(barriers.empty_k(first_position)); // K_0 is no longer read
    if (second_block >= block_end)
      release_q();
    score(first_block, block_scales);
    pack_probabilities<Config>(p, scores);
    for (int block = second_block, following; block < block_end; block = following, ++position) {
      // S_j = Q K_j^T and O += P~_(j-1) V_(j-1) back to back; the softmax of S_j runs while the P.V does.
      const BlockScales block_scales = load_scales(block);
      mbarrier_wait(full_k(position), phase(position));
      mbarrier_wait(full_v(position - 1), phase(position - 1));
      turns.wait_turn();
      issue_q_k<Config>(accumulator, q_tile, stage_base(position) + Layout::kKOffset);
      issue_product(position - 1);
      turns.pass_turn(false);
      following = next_block(block + 1); // the walk's shared-memory reads wait while the GEMMs run, not between steps
      if constexpr (Config::kSoftmaxUnderProduct) {
        wgmma_wait_group<1>(); // S_j has landed; the P.V may still run
        warpgroup_fence_operands(accumulator);
        mbarrier_arrive(barriers.empty_k(first_position + position)); // K_j is no longer read
        if (following >= block_end)
          release_q();
        score(block, block_scales);
        wgmma_wait_group<0>();
        fence_product();
        finish_product(position - 1);
      } else { // the P.V's product is folded before the softmax, so the two are never live together
        wgmma_wait_group<0>();
        warpgroup_fence_operands(accumulator);
        fence_product();
        mbarrier_arrive(barriers.empty_k(first_position + position));
        if (following >= block_end)
          release_q();
        finish_product(position - 1);
        score(block, block_scales);
      }
      pack_probabilities<Config>(p, scores);
    }
    mbarrier_wait(full_v(position - 1), phase(position - 1));
  } else {
    release_q();
  }
  turns.wait_turn();
  if (first_block < block_end)
    issue_product(position - 1);
  turns.pass_turn(last);
  // Waited for on every path, so that ptxas sees O complete before anything reads it (where it cannot tell, it
  // serializes every wgmma of the kernel: C7514).
  wgmma_wait_group<0>();
  fence_product();
  if (first_block < block_end)
    finish_product(position - 1);
  write_results<Config>(state, params, tile, rows, quad_lane);
  return first_block < block_end ? position : 0;
}

// Packed sequences, inline loads: the tile's KV length, causal offset and block ends (the values a dense kernel reads
// from the constant bank) wait in shared memory, in the alignment slack where a persistent CTA keeps its tile slot,
// and are read where the KV loop uses them instead of held in registers through it (held, ptxas spilled 56 bytes for
// sage2-fp8 d128). Written by thread 0 before the CTA's first barrier.
template <class Config> struct InlineTileBounds {
  static_assert(SharedLayout<Config>::kTileSlotOffset % 16 == 0, "st.shared.v4 needs 16-byte alignment");
  // shared-window address of 4 ints: tokens_kv, causal_offset, block_end, min(unmasked_end, block_end) (the blocks
  // before it need no mask)
  unsigned address;
  __device__ __forceinline__ void store(const TileCoordinates &tile, int unmasked_end) const {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(tile.tokens_kv),
                 "r"(tile.causal_offset), "r"(tile.block_end), "r"(unmasked_end)
                 : "memory");
  }
  // Read again at every use (volatile): the value is not kept live across the loop
  __device__ __forceinline__ int load(int index) const {
    int value;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(value) : "r"(address + 4 * index) : "memory");
    return value;
  }
};

// The kernel without a producer warpgroup (Config::kInlineLoads): one warpgroup, one tile, which issues its own TMA
// loads: Q_i and the first kStages blocks up front (thread 0), then K_(j+kStages) while P~_j V_j runs and
// V_(j+kStages) as block j + 1 starts (see `refill_k`). Each block runs in order: S_j = Q K_j^T, its softmax, P~_j V_j,
// the product folded into O. S_j and the P.V's product are never live together, so a thread needs ~170 registers and
// three CTAs share an SM: their GEMMs and softmaxes interleave as the warp schedulers pick (SageAttention2's sm90
// kernel is built this way).
template <class Config>
__device__ __forceinline__ void consume_inline(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                               unsigned shared_base, const StageBarriers<Config> &barriers) {
  static_assert(Config::kConsumers == 1 && !Config::kPersistent && !Config::kBlockSparse,
                "inline loads: one consumer warpgroup, one dense tile per CTA");
  using Layout = SharedLayout<Config>;
  using Accumulator = Select<Config::kQk == QkOperands::int8, int, float>;
  const SageAttentionParams &base = params.base;
  const SageProblemSize &size = base.size;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32, lane = thread % 32, quad_lane = lane % 4;
  const int rows[2] = {tile.q_begin + warp * 16 + lane / 4, tile.q_begin + warp * 16 + lane / 4 + 8};
  const InlineTileBounds<Config> bounds{shared_base + SharedLayout<Config>::kTileSlotOffset};
  // The loop's bounds: dense, the tile's (from the constant bank); packed, from shared memory at each use
  auto block_end = [&] { return Config::kPackedSequences ? bounds.load(2) : tile.block_end; };
  const int tile_unmasked_end = Config::kPackedSequences ? 0 : unmasked_block_end<Config>(tile, tile.q_begin);
  // (packed: already at most block_end, which changes no comparison below)
  auto unmasked_end = [&] { return Config::kPackedSequences ? bounds.load(3) : tile_unmasked_end; };
  auto loop_tile = [&] {
    TileCoordinates masked = tile;
    if constexpr (Config::kPackedSequences) {
      masked.tokens_kv = bounds.load(0);
      masked.causal_offset = bounds.load(1);
    }
    return masked;
  };
  auto stage_base = [&](int block) {
    return shared_base + Layout::kStageOffset + (block % Config::kStages) * Layout::kStageBytes;
  };
  if (thread == 0) {
    load_q<Config>(params, tile, shared_base, barriers);
    for (int block = 0; block < min(block_end(), Config::kStages); ++block) {
      load_k<Config>(params, tile, block, stage_base(block), barriers.full_k(block));
      load_v<Config>(params, tile, block, stage_base(block), barriers.full_v(block));
    }
  }
  ConsumerState<Config> state;
  start_consumer<Config>(state, base, tile, rows);
  const float *k_scales =
      reinterpret_cast<const float *>(base.workspace + base.offsets.k_scales) + tile.kv_head_index * size.k_scale_count;
  const unsigned q_tile = shared_base + Layout::kQOffset;
  using BlockScales = typename CodesSoftmax<Config>::BlockScales;

  Accumulator accumulator[Config::kBlockKv / 2];
  float scores[Config::kBlockKv / 2];
  float rescale[2];
  ProbabilityFragments<Config> p;
  int block_product[Config::kPv == PvOperands::int8 ? ConsumerState<Config>::kOutputChannels / 2 : 1];
  mbarrier_wait(barriers.q_full(), 0);
  // Warp 0 refills a released stage where its wait is (nearly) free: K_j's right after issuing P~_j V_j, V_j's as block
  // j + 1 starts. Every thread arrived on K_j's empty barrier before that wgmma, which they issue together, and on
  // V_j's as they left its wait together. The whole warp waits (a warp-uniform branch: its lanes stay converged, so
  // the next wgmma needs no reconvergence) and one elected lane issues. Refilling each stage from thread 0 as soon as
  // it was released kept the other warps waiting for warp 0 at the next wgmma (H200, ncu, sage2-fp8 d128 at 16k
  // tokens: 11% of the stall samples on the P.V's first wgmma, 3.94 against 3.41 ms with warp-uniform refills). These
  // places also keep ptxas within 168 registers without spills; K's refill at the loop's top spilled 64 bytes.
  const int warp_uniform = __shfl_sync(0xffffffffu, warp, 0);
  auto refills = [&](int block) { // whether warp 0 refills the stage of `block` with block + kStages
    return warp_uniform == 0 && block >= 0 && block + Config::kStages < block_end();
  };
  auto refill_k = [&](int block) {
    if (!refills(block))
      return;
    mbarrier_wait(barriers.empty_k(block), StageBarriers<Config>::phase(block));
    if (elect_one_sync())
      load_k<Config>(params, tile, block + Config::kStages, stage_base(block), barriers.full_k(block));
    __syncwarp();
  };
  auto refill_v = [&](int block) {
    if (!refills(block))
      return;
    mbarrier_wait(barriers.empty_v(block), StageBarriers<Config>::phase(block));
    if (elect_one_sync())
      load_v<Config>(params, tile, block + Config::kStages, stage_base(block), barriers.full_v(block));
    __syncwarp();
  };
  auto run_block = [&](int block, bool masked) { // causal: inlined twice, `masked` a constant
    const unsigned phase = StageBarriers<Config>::phase(block);
    BlockScales block_scales{};
    if constexpr (CodesSoftmax<Config>::kApplies)
      block_scales = CodesSoftmax<Config>::load(k_scales, size.k_scale_count, block * Config::kBlockKv);
    refill_v(block - 1);
    mbarrier_wait(barriers.full_k(block), phase);
    issue_q_k<Config>(accumulator, q_tile, stage_base(block) + Layout::kKOffset);
    wgmma_wait_group<0>();
    warpgroup_fence_operands(accumulator);
    mbarrier_arrive(barriers.empty_k(block)); // K_j is no longer read
    if (masked)
      score_block<Config, true>(state, scores, accumulator, size, loop_tile(), k_scales, block_scales, rows,
                                block * Config::kBlockKv, quad_lane, rescale);
    else
      score_block<Config, false>(state, scores, accumulator, size, tile, k_scales, block_scales, rows,
                                 block * Config::kBlockKv, quad_lane, rescale);
    pack_probabilities<Config>(p, scores);
    rescale_output(state, rescale);
    mbarrier_wait(barriers.full_v(block), phase);
    const unsigned v_tile = stage_base(block) + Layout::kVOffset;
    // Column slices folded one at a time (kSlicedFold: head_dim > 128 with an outer sum), else one group
    constexpr int kFolds = ConsumerState<Config>::kSlicedFold ? ValueSlices<Config>::kCount : 1;
#pragma unroll
    for (int slice = 0; slice < kFolds; ++slice) {
      issue_block_p_v<Config>(state, block_product, p, v_tile, slice);
      if (slice == 0)
        refill_k(block);
      wgmma_wait_group<0>();
      fence_p_v_registers<Config>(state, block_product, p);
      if (slice == kFolds - 1)
        mbarrier_arrive(barriers.empty_v(block)); // V_j is no longer read
      finish_block(state, block_product, slice);
    }
  };
  // Causal: the blocks that need no mask first, then those that cross the diagonal or the sequence's end, each loop
  // with one softmax path (one loop with both spilled 88 bytes at d128, these two 8). Without the causal mask one loop
  // with both paths keeps ptxas within its 168 registers without spills (two loops spilled 44 bytes).
  if constexpr (Config::kCausal) {
    int block = 0;
    for (; block < (Config::kPackedSequences ? unmasked_end() : min(unmasked_end(), block_end())); ++block)
      run_block(block, false);
    for (; block < block_end(); ++block)
      run_block(block, true);
  } else {
    for (int block = 0; block < block_end(); ++block)
      run_block(block, block >= unmasked_end());
  }
  write_results<Config>(state, params, tile, rows, quad_lane);
}

// A consumer warpgroup's tiles, in the order the producer loads them; the ping-pong's turns carry on across tiles.
// `grid_tile`: the tile of a CTA that is not persistent.
template <class Config>
__device__ __forceinline__ void consume_tiles(const SageSm90AttentionParams &params,
                                              const TileSchedule<Config> &schedule, const TileCoordinates &grid_tile,
                                              const VisitedBlocks<Config> &visits, unsigned shared_base,
                                              const StageBarriers<Config> &barriers, int consumer) {
  using Layout = SharedLayout<Config>;
  const TurnTaking<Config> turns{consumer};
  turns.start();
  if constexpr (!Config::kPersistent) {
    const TileCoordinates &tile = grid_tile;
    VisitedBlocks<Config> tile_visits = visits;
    tile_visits.block_end = tile.block_end;
    consume<Config>(params, tile, tile_visits, shared_base, barriers, consumer, turns, 0, 0, true);
    return;
  }
  int position = 0;
  for (int iteration = 0;; ++iteration) {
    // This tile and the next, as the producer claimed them (Q_i may still be in flight: consume waits for it).
    mbarrier_wait(shared_base + Layout::kTileFullOffset, StageBarriers<Config>::phase_of(iteration));
    int index, next;
    asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];\n"
                 : "=r"(index), "=r"(next)
                 : "r"(shared_base + Layout::kTileSlotOffset)
                 : "memory");
    if (index >= schedule.tiles) // the CTA claimed no tile at all
      return;
    const TileCoordinates tile = schedule.coordinates(index, params.base);
    VisitedBlocks<Config> tile_visits = visits;
    tile_visits.block_end = tile.block_end;
    position += consume<Config>(params, tile, tile_visits, shared_base, barriers, consumer, turns, position, iteration,
                                next >= schedule.tiles);
    if (next >= schedule.tiles)
      return;
  }
}

template <class Config> __device__ __forceinline__ void attention_kernel(const SageSm90AttentionParams &params) {
  using Layout = SharedLayout<Config>;
  extern __shared__ __align__(1024) unsigned char shared_memory[];
  // Swizzled TMA boxes and wgmma descriptors need 1024-byte aligned tiles.
  const unsigned raw_base = static_cast<unsigned>(__cvta_generic_to_shared(shared_memory));
  const unsigned shared_base = (raw_base + 1023u) & ~1023u;
  const StageBarriers<Config> barriers{shared_base + Layout::kBarrierOffset};
  const TileSchedule<Config> schedule(params.base.size);
  static_assert(!(Config::kPackedSequences && Config::kBlockSparse), "packed sequences: no block-sparse mask rows");
  // The CTA's tile unless it is persistent (a persistent CTA claims its own)
  const TileCoordinates grid_tile = schedule.coordinates(0, params.base);
  if constexpr (Config::kPackedSequences && !Config::kPersistent)
    if (grid_tile.empty()) // past its sequence's end: the whole CTA leaves before any barrier exists
      return;

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < Config::kStages; ++stage) {
      mbarrier_init(barriers.full_k(stage), 1); // the producer's expect_tx
      mbarrier_init(barriers.full_v(stage), 1);
      mbarrier_init(barriers.empty_k(stage), Config::kConsumers * kWarpgroupThreads);
      mbarrier_init(barriers.empty_v(stage), Config::kConsumers * kWarpgroupThreads);
    }
    mbarrier_init(barriers.q_full(), 1);
    mbarrier_init(barriers.q_empty(), Config::kConsumers * kWarpgroupThreads);
    if constexpr (Config::kPersistent)
      mbarrier_init(shared_base + Layout::kTileFullOffset, 1); // the producer's publication of its claims
    mbarrier_init_fence();
    tma_prefetch_descriptor(&params.q_map);
    tma_prefetch_descriptor(&params.k_map);
    tma_prefetch_descriptor(&params.v_map);
    if constexpr (!Config::kPersistent && !Config::kInlineLoads) // its own thread's barrier: no CTA barrier first
      load_q<Config>(params, grid_tile, shared_base, barriers);
    if constexpr (Config::kInlineLoads && Config::kPackedSequences)
      InlineTileBounds<Config>{shared_base + Layout::kTileSlotOffset}.store(
          grid_tile, min(unmasked_block_end<Config>(grid_tile, grid_tile.q_begin), grid_tile.block_end));
  }
  VisitedBlocks<Config> visits{};
  if constexpr (Config::kBlockSparse) { // read before the roles split: the producer and the consumers walk it alike
    static_assert(!Config::kPersistent, "a block-sparse CTA reads one tile's mask row");
    visits.block_end = grid_tile.block_end;
    visits.kept = collect_kept_blocks<Config>(
        params.base, grid_tile,
        reinterpret_cast<unsigned *>(shared_memory + (shared_base - raw_base) + Layout::kKeptOffset));
  }
  __syncthreads();

  if constexpr (Config::kInlineLoads) {
    consume_inline<Config>(params, grid_tile, shared_base, barriers);
  } else { // (not instantiated with inline loads)
    // Broadcast from lane 0 so that the compiler knows the role is warp-uniform: a wgmma under a branch it considers
    // divergent gets serialized (ptxas C7518).
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
    if (warpgroup == 0) {
      if constexpr (Config::kProducerRegisters > 0) // one consumer: no hand-over needed
        warpgroup_release_registers<Config::kProducerRegisters>();
      if (threadIdx.x == 0) {
        if constexpr (Config::kPersistent) {
          produce<Config>(params, schedule, shared_base, barriers);
        } else {
          int position = 0;
          if constexpr (!Config::kBlockSparse)
            visits.block_end = grid_tile.block_end;
          produce_tile<Config>(params, grid_tile, visits, shared_base, barriers, position);
        }
      }
    } else {
      if constexpr (Config::kConsumerRegisters > 0)
        warpgroup_claim_registers<Config::kConsumerRegisters>();
      consume_tiles<Config>(params, schedule, grid_tile, visits, shared_base, barriers, warpgroup - 1);
    }
  }
}

} // namespace sage::device::sm90
