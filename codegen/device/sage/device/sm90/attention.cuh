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

#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/mbarrier.cuh"
#include "sage/device/sm90/tma.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

namespace sage::device::sm90 {

enum class QkOperands { int8, f16, bf16 };
enum class PvOperands { f16_accumulate_f16, f16_accumulate_f32, int8, e4m3 };
enum class ValueTiles { input, workspace_values, workspace_codes }; // where V_j comes from (KernelPlan ValueSource)

// Shared-memory geometry derived from a Config: every tile is split into column chunks of at most 128 bytes (one
// TMA box and one swizzle atom wide), each chunk a [rows][chunk bytes] block aligned to 1024 bytes.
template <class Config> struct SharedLayout {
  static constexpr int kQkElementBytes = Config::kQk == QkOperands::int8 ? 1 : 2;
  static constexpr int kQkRowBytes = Config::kHeadDim * kQkElementBytes;
  static constexpr int kQkChunkBytes = kQkRowBytes < 128 ? kQkRowBytes : 128;
  static constexpr int kQkChunks = kQkRowBytes / kQkChunkBytes;
  static constexpr int kQChunkStride = Config::kBlockQ * kQkChunkBytes;
  static constexpr int kKChunkStride = Config::kBlockKv * kQkChunkBytes;
  static constexpr int kQBytes = kQkChunks * kQChunkStride;
  static constexpr int kKBytes = kQkChunks * kKChunkStride;

  static constexpr bool kTransposedV = Config::kValues == ValueTiles::workspace_codes;
  // V^T codes: rows are channels, kBlockKv one-byte tokens each. f16 V: rows are tokens, 2 * kHeadDim bytes each.
  static constexpr int kVRows = kTransposedV ? Config::kHeadDim : Config::kBlockKv;
  static constexpr int kVRowBytes = kTransposedV ? Config::kBlockKv : 2 * Config::kHeadDim;
  static constexpr int kVChunkBytes = kVRowBytes < 128 ? kVRowBytes : 128;
  static constexpr int kVChunks = kVRowBytes / kVChunkBytes;
  static constexpr int kVChunkStride = kVRows * kVChunkBytes;
  static constexpr int kVBytes = kVChunks * kVChunkStride;

  static __host__ __device__ constexpr int align(int bytes) { return (bytes + 1023) / 1024 * 1024; }
  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = align(kQBytes);
  static constexpr int kKOffset = 0; // within a stage
  static constexpr int kVOffset = align(kKBytes);
  static constexpr int kStageBytes = align(kVOffset + kVBytes);
  // Two-level accumulation keeps its outer f32 sum here, not in registers: [consumer thread][register], by register
  // first so that a warpgroup's accesses are consecutive words.
  static constexpr int kFlushBytes = Config::kTwoLevel ? Config::kConsumers * 128 * (Config::kHeadDim / 2) * 4 : 0;
  static constexpr int kFlushOffset = kStageOffset + Config::kStages * kStageBytes;
  static constexpr int kBarrierOffset = kFlushOffset + kFlushBytes;
  // full[kStages], empty[kStages], q_full: 8 bytes each
  static constexpr int kBarrierBytes = (2 * Config::kStages + 1) * 8;
  static constexpr int kTotalBytes = kBarrierOffset + kBarrierBytes;
  // The dynamic buffer is only guaranteed 16-byte alignment: the kernel rounds its base up to 1024.
  static constexpr int kDynamicBytes = kTotalBytes + 1024;

  static constexpr int kStageTransactionBytes = kKBytes + kVBytes;
};

template <int kTokensPerGroup, int kInterleave> __device__ __forceinline__ int scale_group(int token) {
  if constexpr (kTokensPerGroup == 0)
    return 0;
  else
    return token / kTokensPerGroup * kInterleave + token % kInterleave;
}

// What one consumer thread keeps across the KV loop: its two rows (g and g + 8 of its warp's 16) and their state.
template <class Config> struct ConsumerState {
  static constexpr int kScoreRegisters = Config::kBlockKv / 2;     // m64 x kBlockKv, per thread
  static constexpr int kOutputF32Registers = Config::kHeadDim / 2; // m64 x kHeadDim f32, per thread
  static constexpr bool kF16Accumulator = Config::kPv == PvOperands::f16_accumulate_f16;
  static constexpr int kOutputRegisters = kF16Accumulator ? Config::kHeadDim / 4 : kOutputF32Registers;
  using OutputRegister = Select<kF16Accumulator, unsigned, float>;

  OutputRegister output[kOutputRegisters];                                  // the P.V accumulator (f16x2 pairs or f32)
  float flushed[Config::kPv == PvOperands::int8 ? kOutputF32Registers : 1]; // int8 P.V: the f32 sum of s32 blocks
  float output_max[2]; // the m that `output` is relative to (m of the last block added)
  float flush_max[2];  // two-level: the m that the shared-memory sum is relative to (-inf: nothing flushed yet)
  float *flush_sum;    // two-level: this thread's column of the shared-memory sum ([register][thread])
  float row_factor[2]; // delta_Q x the factor that puts S in base 2
  float row_max[2];    // m_i
  float row_sum[2];    // this thread's share of l_i (its own columns)
  int blocks_since_flush;
};

template <class Config>
__device__ __forceinline__ float k_column_scale(const float *k_scales, int k_scale_count, int token) {
  int group = scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(token);
  group = group < k_scale_count ? group : k_scale_count - 1; // tiles may reach past the padded sequence
  return __ldg(k_scales + group);
}

// S (s32 or f32 accumulator) -> f32 scores in the base-2 domain: score = S x row_factor x delta_K(column).
template <class Config, class Accumulator>
__device__ __forceinline__ void
dequantize_scores(float (&scores)[Config::kBlockKv / 2], const Accumulator (&accumulator)[Config::kBlockKv / 2],
                  const float (&row_factor)[2], const float *k_scales, int k_scale_count, int kv_begin, int quad_lane) {
  constexpr int kTiles = Config::kBlockKv / 8;
  static_assert(Config::kHeadDim * 127 * 127 < (1 << 22), "s32 scores too large for small_int_to_float");
  if constexpr (Config::kQk != QkOperands::int8) {
#pragma unroll
    for (int i = 0; i < Config::kBlockKv / 2; ++i)
      scores[i] = accumulator[i] * row_factor[(i / 2) % 2];
  } else { // int8 codes with K scales that vary inside an 8-column tile (per-thread groups): CodesSoftmax does the rest
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        const float k_scale =
            k_column_scale<Config>(k_scales, k_scale_count, kv_begin + tile * 8 + quad_lane * 2 + column);
#pragma unroll
        for (int half = 0; half < 2; ++half)
          scores[tile * 4 + half * 2 + column] =
              small_int_to_float(accumulator[tile * 4 + half * 2 + column]) * (row_factor[half] * k_scale);
      }
  }
}

// Tokens past the end of the sequence, and when causal the tokens after a row's diagonal (token j is visible to row
// i iff j <= i + causal_offset: tokens_kv - tokens_q aligns bottom-right, 0 top-left), get -inf.
template <class Config>
__device__ __forceinline__ void mask_scores(float (&scores)[Config::kBlockKv / 2], const int (&rows)[2], int kv_begin,
                                            int tokens_kv, int causal_offset, int quad_lane) {
#pragma unroll
  for (int tile = 0; tile < Config::kBlockKv / 8; ++tile)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int token = kv_begin + tile * 8 + quad_lane * 2 + i % 2;
      bool visible = token < tokens_kv;
      if constexpr (Config::kCausal)
        visible = visible && token <= rows[i / 2] + causal_offset;
      if (!visible)
        scores[tile * 4 + i] = negative_infinity();
    }
}

// m_i^j = max(m_i^(j-1), rowmax(S)); P~ = exp2(S - m_i^j) in place; l_i^j = exp2(m^(j-1) - m^j) l^(j-1) + rowsum(P~)
// (in f32, before P~ is rounded). Returns the factors exp2(m^(j-1) - m^j) that O is multiplied by. 8-bit P~ is
// computed directly in code units, exp2(S - m + log2(1 / P's scale)): no multiply before the conversion, and l sums
// the same units (the epilogue's division by l removes them; the LSE subtracts their log2).
template <class Config>
__device__ __forceinline__ void online_softmax(float (&scores)[Config::kBlockKv / 2], float (&row_max)[2],
                                               float (&row_sum)[2], float (&rescale)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float block_max = row_max[half];
#pragma unroll
    for (int tile = 0; tile < Config::kBlockKv / 8; ++tile)
      block_max = fmaxf(block_max, fmaxf(scores[tile * 4 + half * 2], scores[tile * 4 + half * 2 + 1]));
    block_max = quad_max(block_max);
    // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
    const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
    rescale[half] = fast_exp2(row_max[half] - subtrahend);
    row_max[half] = block_max;
    float block_sum = 0.0f;
#pragma unroll
    for (int tile = 0; tile < Config::kBlockKv / 8; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        float &score = scores[tile * 4 + half * 2 + column];
        score = fast_exp2(score - (subtrahend - Config::kProbabilityCodeLog2));
        block_sum += score;
      }
    row_sum[half] = row_sum[half] * rescale[half] + block_sum;
  }
}

template <int kCount> __device__ __forceinline__ void rescale_f32(float (&values)[kCount], const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    values[i] *= rescale[(i / 2) % 2];
}

template <int kCount>
__device__ __forceinline__ void rescale_f16x2(unsigned (&values)[kCount], const float (&rescale)[2]) {
  const unsigned factors[2] = {pack_f16x2(rescale[0], rescale[0]), pack_f16x2(rescale[1], rescale[1])};
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    values[i] = scale_f16x2(values[i], factors[i % 2]);
}

// P~ as the register A operand of the P.V wgmma: 4 registers per k step (16 tokens for f16, 32 for 8-bit codes).
template <class Config> struct ProbabilityFragments {
  static constexpr bool kEightBit = Config::kPv == PvOperands::int8 || Config::kPv == PvOperands::e4m3;
  static constexpr int kStepTokens = kEightBit ? 32 : 16;
  static constexpr int kSteps = Config::kBlockKv / kStepTokens;
  unsigned registers[kSteps][4];
};

template <class Config>
__device__ __forceinline__ void pack_probabilities(ProbabilityFragments<Config> &p,
                                                   const float (&probabilities)[Config::kBlockKv / 2]) {
  using Fragments = ProbabilityFragments<Config>;
  if constexpr (!Fragments::kEightBit) {
    // Tiles 2s and 2s + 1 of S (rows g, g + 8) are exactly the A fragment of the k16 step s.
#pragma unroll
    for (int step = 0; step < Fragments::kSteps; ++step) {
      const float *first = probabilities + (2 * step) * 4;
      const float *second = probabilities + (2 * step + 1) * 4;
      p.registers[step][0] = pack_f16x2(first[0], first[1]);
      p.registers[step][1] = pack_f16x2(first[2], first[3]);
      p.registers[step][2] = pack_f16x2(second[0], second[1]);
      p.registers[step][3] = pack_f16x2(second[2], second[3]);
    }
  } else {
    constexpr float c = 1.0f; // P~ arrives already scaled to its codes (kProbabilityCodeLog2 in the exponent)
#pragma unroll
    for (int step = 0; step < Fragments::kSteps; ++step) {
      const float *t0 = probabilities + (4 * step) * 4;
      const float *t1 = t0 + 4;
      const float *t2 = t0 + 8;
      const float *t3 = t0 + 12;
      if constexpr (Config::kPv == PvOperands::e4m3) {
        p.registers[step][0] = pack_e4m3x4(t0[0] * c, t0[1] * c, t1[0] * c, t1[1] * c);
        p.registers[step][1] = pack_e4m3x4(t0[2] * c, t0[3] * c, t1[2] * c, t1[3] * c);
        p.registers[step][2] = pack_e4m3x4(t2[0] * c, t2[1] * c, t3[0] * c, t3[1] * c);
        p.registers[step][3] = pack_e4m3x4(t2[2] * c, t2[3] * c, t3[2] * c, t3[3] * c);
      } else {
        p.registers[step][0] = pack_s8x4(t0[0] * c, t0[1] * c, t1[0] * c, t1[1] * c);
        p.registers[step][1] = pack_s8x4(t0[2] * c, t0[3] * c, t1[2] * c, t1[3] * c);
        p.registers[step][2] = pack_s8x4(t2[0] * c, t2[1] * c, t3[0] * c, t3[1] * c);
        p.registers[step][3] = pack_s8x4(t2[2] * c, t2[3] * c, t3[2] * c, t3[3] * c);
      }
    }
  }
}

// Issues S = Q_i K_j^T for this consumer's 64 rows as one wgmma group: one wgmma per k step (32 bytes of a row),
// both operands in shared memory. The caller waits (wgmma_wait_group) and fences the accumulator before reading it.
template <class Config, class Accumulator>
__device__ __forceinline__ void issue_q_k(Accumulator (&accumulator)[Config::kBlockKv / 2], unsigned q_tile,
                                          unsigned k_tile) {
  using Layout = SharedLayout<Config>;
  constexpr Swizzle kSwizzle = swizzle_of_rows<Layout::kQkChunkBytes>();
  constexpr unsigned kCoreGroupBytes = 8 * Layout::kQkChunkBytes; // 8 rows: the next core matrices along M/N
  constexpr int kSteps = Layout::kQkRowBytes / 32;
  warpgroup_fence_operands(accumulator);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int chunk = step * 32 / Layout::kQkChunkBytes, within = step * 32 % Layout::kQkChunkBytes;
    const unsigned long long a =
        matrix_descriptor(q_tile + chunk * Layout::kQChunkStride + within, 16, kCoreGroupBytes, kSwizzle);
    const unsigned long long b =
        matrix_descriptor(k_tile + chunk * Layout::kKChunkStride + within, 16, kCoreGroupBytes, kSwizzle);
    if constexpr (Config::kQk == QkOperands::int8)
      WgmmaS8SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
    else if constexpr (Config::kQk == QkOperands::f16)
      WgmmaF16SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
    else
      WgmmaBf16SS<Config::kBlockKv>::run(accumulator, a, b, step > 0);
  }
  wgmma_commit_group();
}

// Issues O (+)= P~ V_j as one wgmma group: one wgmma per k step of P~; `accumulate` = 0 restarts the accumulator.
// P~'s registers and O must not be touched until the group has completed.
template <class Config, class Accumulator, int kCount>
__device__ __forceinline__ void issue_p_v(Accumulator (&output)[kCount], const ProbabilityFragments<Config> &p,
                                          unsigned v_tile, bool accumulate) {
  using Layout = SharedLayout<Config>;
  using Fragments = ProbabilityFragments<Config>;
  warpgroup_fence_operands(output);
  wgmma_fence();
#pragma unroll
  for (int step = 0; step < Fragments::kSteps; ++step) {
    const int scale_d = accumulate || step > 0;
    if constexpr (Layout::kTransposedV) {
      // V^T [channels][tokens], K-major: step s reads tokens 32s .. 32s + 31 of every channel row.
      constexpr Swizzle kSwizzle = swizzle_of_rows<Layout::kVChunkBytes>();
      const int chunk = step * 32 / Layout::kVChunkBytes, within = step * 32 % Layout::kVChunkBytes;
      const unsigned long long b =
          matrix_descriptor(v_tile + chunk * Layout::kVChunkStride + within, 16, 8 * Layout::kVChunkBytes, kSwizzle);
      if constexpr (Config::kPv == PvOperands::e4m3)
        WgmmaE4m3RS<Config::kHeadDim>::run(output, p.registers[step], b, scale_d);
      else
        WgmmaS8RS<Config::kHeadDim>::run(output, p.registers[step], b, scale_d);
    } else {
      // V [tokens][channels], MN-major: step s starts 16 token rows further; channel chunks are LBO apart.
      constexpr Swizzle kSwizzle = swizzle_of_rows<Layout::kVChunkBytes>();
      const unsigned long long b = matrix_descriptor(v_tile + step * 16 * Layout::kVChunkBytes, Layout::kVChunkStride,
                                                     8 * Layout::kVChunkBytes, kSwizzle);
      if constexpr (Config::kPv == PvOperands::f16_accumulate_f16)
        WgmmaF16RSF16<Config::kHeadDim>::run(output, p.registers[step], b, scale_d);
      else
        WgmmaF16RSF32<Config::kHeadDim>::run(output, p.registers[step], b, scale_d);
    }
  }
  wgmma_commit_group();
}

// Where this CTA works: its Q block, head, batch and the KV blocks it visits.
struct TileCoordinates {
  int q_block, head, batch, kv_head;
  int q_begin;
  long long q_head_index, kv_head_index;
  int kv_blocks, block_end; // [0, block_end) of kv_blocks
  int causal_offset;        // key j is visible to row i iff j <= i + causal_offset (SageAttentionParams)
};

template <class Config>
__device__ __forceinline__ TileCoordinates tile_coordinates(const SageProblemSize &size, int causal_offset) {
  TileCoordinates tile;
  tile.q_block = Config::kReverseQBlocks ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  tile.head = blockIdx.y;
  tile.batch = blockIdx.z;
  tile.kv_head = tile.head / (size.heads_q / size.heads_kv);
  tile.q_begin = tile.q_block * Config::kBlockQ;
  tile.q_head_index = static_cast<long long>(tile.batch) * size.heads_q + tile.head;
  tile.kv_head_index = static_cast<long long>(tile.batch) * size.heads_kv + tile.kv_head;
  tile.kv_blocks = (size.tokens_kv + Config::kBlockKv - 1) / Config::kBlockKv;
  tile.causal_offset = causal_offset; // tokens_kv - tokens_q: bottom-right aligned; 0: top-left
  tile.block_end = tile.kv_blocks;
  if constexpr (Config::kCausal) { // blocks after the diagonal of this Q block's last row are skipped
    const int last_row = min(tile.q_begin + Config::kBlockQ, size.tokens_q) - 1;
    const int last_visible_token = last_row + tile.causal_offset;
    tile.block_end = last_visible_token < 0 ? 0 : min(tile.kv_blocks, last_visible_token / Config::kBlockKv + 1);
  }
  return tile;
}

// The producer: Q_i once, then K_j and V_j for every visited block into stage (iteration % kStages).
template <class Config>
__device__ __forceinline__ void produce(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                        unsigned shared_base, unsigned barriers) {
  using Layout = SharedLayout<Config>;
  const SageProblemSize &size = params.base.size;
  const unsigned q_full = barriers + 2 * Config::kStages * 8;
  tma_prefetch_descriptor(&params.q_map);
  tma_prefetch_descriptor(&params.k_map);
  tma_prefetch_descriptor(&params.v_map);
  mbarrier_arrive_expect_tx(q_full, Layout::kQBytes);
  const int q_row = static_cast<int>(tile.q_head_index * size.padded_q + tile.q_begin);
#pragma unroll
  for (int chunk = 0; chunk < Layout::kQkChunks; ++chunk)
    tma_load_2d(shared_base + Layout::kQOffset + chunk * Layout::kQChunkStride, &params.q_map, q_full,
                chunk * Layout::kQkChunkBytes, q_row);
  for (int block = 0, iteration = 0; block < tile.block_end; ++block, ++iteration) {
    const int stage = iteration % Config::kStages;
    const unsigned phase = (iteration / Config::kStages) & 1u;
    const unsigned full = barriers + stage * 8, empty = barriers + (Config::kStages + stage) * 8;
    mbarrier_wait(empty, phase ^ 1u); // a fresh barrier passes parity 1: the first kStages loads go straight out
    mbarrier_arrive_expect_tx(full, Layout::kStageTransactionBytes);
    const unsigned stage_base = shared_base + Layout::kStageOffset + stage * Layout::kStageBytes;
    const int kv_begin = block * Config::kBlockKv;
    const int k_row = static_cast<int>(tile.kv_head_index * size.padded_kv + kv_begin);
#pragma unroll
    for (int chunk = 0; chunk < Layout::kQkChunks; ++chunk)
      tma_load_2d(stage_base + Layout::kKOffset + chunk * Layout::kKChunkStride, &params.k_map, full,
                  chunk * Layout::kQkChunkBytes, k_row);
#pragma unroll
    for (int chunk = 0; chunk < Layout::kVChunks; ++chunk) {
      const unsigned destination = stage_base + Layout::kVOffset + chunk * Layout::kVChunkStride;
      if constexpr (Config::kValues == ValueTiles::workspace_codes) // [b * h_kv * d rows][padded_kv bytes]
        tma_load_2d(destination, &params.v_map, full, kv_begin + chunk * Layout::kVChunkBytes,
                    static_cast<int>(tile.kv_head_index * Config::kHeadDim));
      else if constexpr (Config::kValues == ValueTiles::workspace_values) // [b * h_kv * padded_kv rows][2d bytes]
        tma_load_2d(destination, &params.v_map, full, chunk * Layout::kVChunkBytes, k_row);
      else // the caller's V: [b][h_kv][tokens_kv][2d bytes], any strides TMA accepts
        tma_load_4d(destination, &params.v_map, full, chunk * Layout::kVChunkBytes, kv_begin, tile.kv_head, tile.batch);
    }
  }
}

// O_i = diag(l_i)^-1 O_i (x delta_V x P's scale) (+ mean(V)) in the input's dtype, then the LSE.
template <class Config>
__device__ __forceinline__ void write_results(ConsumerState<Config> &state, const SageSm90AttentionParams &params,
                                              const TileCoordinates &tile, const int (&rows)[2], int quad_lane) {
  const SageAttentionParams &base = params.base;
  const SageProblemSize &size = base.size;
  constexpr bool kCodes = Config::kPv == PvOperands::int8 || Config::kPv == PvOperands::e4m3;
  float output[Config::kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < Config::kHeadDim / 2; ++i) {
    float value;
    if constexpr (Config::kPv == PvOperands::int8) {
      value = state.flushed[i];
    } else if constexpr (ConsumerState<Config>::kF16Accumulator) {
      float low, high;
      unpack_f16x2(state.output[i / 2], low, high);
      value = i % 2 == 0 ? low : high;
    } else {
      value = state.output[i];
    }
    if constexpr (Config::kTwoLevel) // the flushed sum, brought to the final m
      value += state.flush_sum[i * kWarpgroupThreads * Config::kConsumers] * flush_factor(state, (i / 2) % 2);
    output[i] = value;
  }
  const unsigned char *workspace = base.workspace;
  const float *v_scales =
      reinterpret_cast<const float *>(workspace + base.offsets.v_scales) + tile.kv_head_index * Config::kHeadDim;
  const float *v_mean =
      reinterpret_cast<const float *>(workspace + base.offsets.v_mean) + tile.kv_head_index * Config::kHeadDim;
  unsigned short *o =
      static_cast<unsigned short *>(base.o) + tile.batch * base.o_strides.batch + tile.head * base.o_strides.head;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.row_sum[half] = quad_sum(state.row_sum[half]);
    const int row = rows[half];
    if (row >= size.tokens_q)
      continue;
    const bool visible = state.row_sum[half] > 0.0f;
    const float inverse_sum = visible ? 1.0f / state.row_sum[half] : 0.0f;
#pragma unroll
    for (int tile_n = 0; tile_n < Config::kHeadDim / 8; ++tile_n) {
      const int channel = tile_n * 8 + quad_lane * 2;
      float low = output[tile_n * 4 + half * 2] * inverse_sum;
      float high = output[tile_n * 4 + half * 2 + 1] * inverse_sum;
      if constexpr (kCodes) {
        low *= v_scales[channel]; // psi_V^-1 (P's code scale is in l, which summed the codes' values)
        high *= v_scales[channel + 1];
      }
      if constexpr (Config::kSmoothedV) {
        if (visible) {
          low += v_mean[channel];
          high += v_mean[channel + 1];
        }
      }
      const unsigned packed = Config::kBf16 ? pack_bf16x2(low, high) : pack_f16x2(low, high);
      *reinterpret_cast<unsigned *>(o + row * base.o_strides.token + channel) = packed;
    }
  }
  if constexpr (Config::kWriteLse) {
    if (!base.lse)
      return;
    constexpr float kLn2 = 0.693147180559945309f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = rows[half];
      float correction = 0.0f;
      if constexpr (Config::kLseCorrection) {
        // K was smoothed: every score of row i moved by q_i . mean(K) / sqrt(d); read from the caller's Q (the
        // quantization error of q times mean(K) would not be small). The quad's lanes split the channels.
        const float *k_mean =
            reinterpret_cast<const float *>(workspace + base.offsets.k_mean) + tile.kv_head_index * Config::kHeadDim;
        const unsigned short *q = static_cast<const unsigned short *>(base.q) + tile.batch * base.q_strides.batch +
                                  tile.head * base.q_strides.head;
        float sum = 0.0f;
        if (row < size.tokens_q)
          for (int channel = quad_lane; channel < Config::kHeadDim; channel += 4)
            sum += decode_input_element<Config::kBf16>(q[row * base.q_strides.token + channel]) * k_mean[channel];
        correction = quad_sum(sum) * base.softmax_scale;
      }
      if (quad_lane != 0 || row >= size.tokens_q)
        continue;
      const float sum = state.row_sum[half];
      base.lse[tile.q_head_index * size.tokens_q + row] =
          sum > 0.0f ? (state.row_max[half] + fast_log2(sum) - Config::kProbabilityCodeLog2) * kLn2 + correction
                     : negative_infinity();
    }
  }
}

// S_i^j (waited for) -> P~_i^j's scores in f32: dequantization, the mask when kMasked, the online softmax.
// The online softmax straight from int8 Q.K^T's s32 accumulators, when every 8-column tile has one K scale: 5
// instructions per score instead of 8. A code's f32 image x = bits(s32 + 0x4B400000) is 1.5 x 2^23 + s32 (exact,
// and ordered like s32), so the row max is taken on x per scale group, and P~ = exp2(x f - (1.5 x 2^23 f + m)) is one
// FFMA with f = delta_Q delta_K (base 2). The subtracted constant is rounded once: |error| <= f, one s32 unit.
template <class Config> struct CodesSoftmax {
  static constexpr int kTiles = Config::kBlockKv / 8;
  static constexpr int kGroupTokens = Config::kKScaleTokensPerGroup;
  static constexpr bool kApplies =
      Config::kQk == QkOperands::int8 && Config::kKScaleInterleave == 1 && (kGroupTokens == 0 || kGroupTokens % 8 == 0);
  static constexpr int kTilesPerGroup =
      !kApplies ? 1 : (kGroupTokens == 0 || kGroupTokens >= Config::kBlockKv ? kTiles : kGroupTokens / 8);
  static constexpr int kGroups = kTiles / kTilesPerGroup;
  static constexpr float kOffset = 12582912.0f; // 1.5 x 2^23

  // The K scales of a block, loaded before its S is waited for (their latency then hides behind the wgmma).
  struct BlockScales {
    float k_scale[kGroups];
  };
  static __device__ __forceinline__ BlockScales load(const float *k_scales, int k_scale_count, int kv_begin) {
    BlockScales scales;
#pragma unroll
    for (int group = 0; group < kGroups; ++group)
      scales.k_scale[group] = k_column_scale<Config>(k_scales, k_scale_count, kv_begin + group * kTilesPerGroup * 8);
    return scales;
  }

  template <bool kMasked>
  static __device__ __forceinline__ void
  run(ConsumerState<Config> &state, float (&x)[Config::kBlockKv / 2], const int (&accumulator)[Config::kBlockKv / 2],
      const SageProblemSize &size, const TileCoordinates &tile, const BlockScales &scales, const int (&rows)[2],
      int kv_begin, int quad_lane, float (&rescale)[2]) {
    const float(&k_scale)[kGroups] = scales.k_scale;
#pragma unroll
    for (int i = 0; i < Config::kBlockKv / 2; ++i)
      x[i] = __int_as_float(accumulator[i] + 0x4B400000);
    if constexpr (kMasked) // -inf stays -inf through the FFMA below
      mask_scores<Config>(x, rows, kv_begin, size.tokens_kv, tile.causal_offset, quad_lane);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = state.row_max[half];
      float factor[kGroups];
#pragma unroll
      for (int group = 0; group < kGroups; ++group) {
        factor[group] = state.row_factor[half] * k_scale[group];
        float group_max = negative_infinity();
#pragma unroll
        for (int tile = group * kTilesPerGroup; tile < (group + 1) * kTilesPerGroup; ++tile)
          group_max = fmaxf(group_max, fmaxf(x[tile * 4 + half * 2], x[tile * 4 + half * 2 + 1]));
        if (group_max != negative_infinity())
          block_max = fmaxf(block_max, (group_max - kOffset) * factor[group]);
      }
      block_max = quad_max(block_max);
      // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
      const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
      rescale[half] = fast_exp2(state.row_max[half] - subtrahend);
      state.row_max[half] = block_max;
      float block_sum = 0.0f;
#pragma unroll
      for (int group = 0; group < kGroups; ++group) {
        const float shift = kOffset * factor[group] + (subtrahend - Config::kProbabilityCodeLog2);
#pragma unroll
        for (int tile = group * kTilesPerGroup; tile < (group + 1) * kTilesPerGroup; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            float &score = x[tile * 4 + half * 2 + column];
            score = fast_exp2(fmaf(score, factor[group], -shift));
            block_sum += score;
          }
      }
      state.row_sum[half] = state.row_sum[half] * rescale[half] + block_sum;
    }
  }
};

template <class Config, bool kMasked, class Accumulator>
__device__ __forceinline__ void score_block(ConsumerState<Config> &state, float (&scores)[Config::kBlockKv / 2],
                                            const Accumulator (&accumulator)[Config::kBlockKv / 2],
                                            const SageProblemSize &size, const TileCoordinates &tile,
                                            const float *k_scales,
                                            const typename CodesSoftmax<Config>::BlockScales &block_scales,
                                            const int (&rows)[2], int kv_begin, int quad_lane, float (&rescale)[2]) {
  if constexpr (CodesSoftmax<Config>::kApplies) {
    CodesSoftmax<Config>::template run<kMasked>(state, scores, accumulator, size, tile, block_scales, rows, kv_begin,
                                                quad_lane, rescale);
  } else {
    dequantize_scores<Config>(scores, accumulator, state.row_factor, k_scales, size.k_scale_count, kv_begin, quad_lane);
    if constexpr (kMasked)
      mask_scores<Config>(scores, rows, kv_begin, size.tokens_kv, tile.causal_offset, quad_lane);
    online_softmax<Config>(scores, state.row_max, state.row_sum, rescale);
  }
}

// exp2(m_flush - m) for a row half: what the shared-memory sum is multiplied by to be relative to the m of `output`
// (0 while nothing was flushed; rows that saw no key yet have nothing to scale).
template <class Config> __device__ __forceinline__ float flush_factor(const ConsumerState<Config> &state, int half) {
  const float flushed = state.flush_max[half], current = state.output_max[half];
  return flushed == negative_infinity() || current == negative_infinity() ? 0.0f : fast_exp2(flushed - current);
}

// O_i^(j-1) *= exp2(m^(j-1) - m^j) before P~_i^j V_j is added: the accumulator(s) this P.V path keeps.
template <class Config>
__device__ __forceinline__ void rescale_output(ConsumerState<Config> &state, const float (&rescale)[2]) {
  if constexpr (Config::kPv != PvOperands::int8) {
    if constexpr (ConsumerState<Config>::kF16Accumulator)
      rescale_f16x2(state.output, rescale);
    else
      rescale_f32(state.output, rescale);
  }
  if constexpr (Config::kPv == PvOperands::int8)
    rescale_f32(state.flushed, rescale);
}

// After P~_i^j V_j has completed: int8 adds its s32 block product into the f32 sum; two-level accumulation adds the
// inner accumulator into the outer one every kFlushPeriod blocks and restarts it.
template <class Config, int kProductRegisters>
__device__ __forceinline__ void finish_block(ConsumerState<Config> &state,
                                             const int (&block_product)[kProductRegisters]) {
  if constexpr (Config::kPv == PvOperands::int8) {
#pragma unroll
    for (int i = 0; i < Config::kHeadDim / 2; ++i)
      state.flushed[i] += small_int_to_float(block_product[i]); // |P V| <= 128 x 127 x 127 < 2^22
  } else if constexpr (Config::kTwoLevel) {
    if (++state.blocks_since_flush == Config::kFlushPeriod) {
      // sum = sum x exp2(m_flush - m) + inner, now relative to m; the inner accumulator restarts.
      state.blocks_since_flush = 0;
      const float factors[2] = {flush_factor(state, 0), flush_factor(state, 1)};
#pragma unroll
      for (int i = 0; i < Config::kHeadDim / 2; ++i) {
        float inner;
        if constexpr (ConsumerState<Config>::kF16Accumulator) {
          float low, high;
          unpack_f16x2(state.output[i / 2], low, high);
          inner = i % 2 == 0 ? low : high;
        } else {
          inner = state.output[i];
        }
        float &sum = state.flush_sum[i * kWarpgroupThreads * Config::kConsumers];
        sum = sum * factors[(i / 2) % 2] + inner;
      }
#pragma unroll
      for (int i = 0; i < ConsumerState<Config>::kOutputRegisters; ++i)
        state.output[i] = 0;
      state.flush_max[0] = state.output_max[0];
      state.flush_max[1] = state.output_max[1];
    }
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

// A consumer warpgroup's main loop, software-pipelined by one P.V: in step j it issues S_j = Q K_j^T and
// O += P~_(j-1) V_(j-1) back to back, then computes the softmax of S_j while the P.V runs, then packs P~_j.
// Every consumer visits the CTA's blocks [0, block_end) (rows past a block's reach see it fully masked), so the
// pipeline's phases and the ping-pong's turns match between consumers.
template <class Config>
__device__ __forceinline__ void consume(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                        unsigned shared_base, unsigned barriers, int consumer) {
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
  float q_row_scale[2] = {1.0f, 1.0f};
  if constexpr (Config::kQk == QkOperands::int8) {
    const float *q_scales =
        reinterpret_cast<const float *>(workspace + base.offsets.q_scales) + tile.q_head_index * size.q_scale_count;
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
#pragma unroll
  for (int i = 0; i < ConsumerState<Config>::kOutputRegisters; ++i)
    state.output[i] = 0;
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(state.flushed) / sizeof(float)); ++i)
    state.flushed[i] = 0.0f;
  state.blocks_since_flush = 0;
  state.output_max[0] = state.output_max[1] = state.flush_max[0] = state.flush_max[1] = negative_infinity();
  state.flush_sum = nullptr;
  if constexpr (Config::kTwoLevel) {
    extern __shared__ __align__(1024) unsigned char shared_memory[];
    float *sums = reinterpret_cast<float *>(
        shared_memory + (shared_base - static_cast<unsigned>(__cvta_generic_to_shared(shared_memory))) +
        Layout::kFlushOffset);
    state.flush_sum = sums + consumer * kWarpgroupThreads + thread;
#pragma unroll
    for (int i = 0; i < Config::kHeadDim / 2; ++i)
      state.flush_sum[i * kWarpgroupThreads * Config::kConsumers] = 0.0f;
  }
  const float *k_scales =
      reinterpret_cast<const float *>(workspace + base.offsets.k_scales) + tile.kv_head_index * size.k_scale_count;

  // Blocks from `unmasked_end` on cross the sequence's end or (causal) this consumer's first row's diagonal.
  int unmasked_end = size.tokens_kv / Config::kBlockKv;
  if constexpr (Config::kCausal) {
    const int diagonal_limit = consumer_row + tile.causal_offset + 1;
    unmasked_end = diagonal_limit <= 0 ? 0 : min(unmasked_end, diagonal_limit / Config::kBlockKv);
  }
  const unsigned q_tile = shared_base + Layout::kQOffset + consumer * 64 * Layout::kQkChunkBytes;
  const TurnTaking<Config> turns{consumer};
  auto full_barrier = [&](int block) { return barriers + (block % Config::kStages) * 8; };
  auto empty_barrier = [&](int block) { return barriers + (Config::kStages + block % Config::kStages) * 8; };
  auto phase_of = [&](int block) { return static_cast<unsigned>((block / Config::kStages) & 1); };
  auto stage_base = [&](int block) {
    return shared_base + Layout::kStageOffset + (block % Config::kStages) * Layout::kStageBytes;
  };

  turns.start();
  mbarrier_wait(barriers + 2 * Config::kStages * 8, 0); // Q_i
  const int blocks = tile.block_end;
  Accumulator accumulator[Config::kBlockKv / 2];
  float scores[Config::kBlockKv / 2];
  float rescale[2];
  ProbabilityFragments<Config> p;
  int block_product[Config::kPv == PvOperands::int8 ? Config::kHeadDim / 2 : 1];
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
  auto issue_product = [&](int block) {
    rescale_output(state, rescale);
    state.output_max[0] = state.row_max[0]; // m_j: S_(j+1)'s softmax has not run yet
    state.output_max[1] = state.row_max[1];
    const unsigned v_tile = stage_base(block) + Layout::kVOffset;
    if constexpr (Config::kPv == PvOperands::int8)
      issue_p_v<Config>(block_product, p, v_tile, false);
    else
      issue_p_v<Config>(state.output, p, v_tile, true);
  };
  // After the P.V of block j completed: P~'s registers were read by the asynchronous wgmma until now (the asm
  // statement that issued it was their last visible use), so fence them; release the stage; fold the product.
  auto fence_product = [&] {
#pragma unroll
    for (int step = 0; step < ProbabilityFragments<Config>::kSteps; ++step)
      warpgroup_fence_operands(p.registers[step]);
    if constexpr (Config::kPv == PvOperands::int8)
      warpgroup_fence_operands(block_product);
    else
      warpgroup_fence_operands(state.output);
  };
  auto finish_product = [&](int block) {
    mbarrier_arrive(empty_barrier(block)); // K_j, V_j are no longer read
    finish_block(state, block_product);
  };

  // The loop is peeled so that its body issues every wgmma unconditionally (ptxas serializes wgmma whose register
  // dependences it cannot follow through branches).
  if (blocks > 0) {
    const BlockScales block_scales = load_scales(0);
    mbarrier_wait(full_barrier(0), 0);
    turns.wait_turn();
    issue_q_k<Config>(accumulator, q_tile, stage_base(0) + Layout::kKOffset);
    turns.pass_turn(false);
    wgmma_wait_group<0>();
    warpgroup_fence_operands(accumulator);
    score(0, block_scales);
    pack_probabilities<Config>(p, scores);
  }
  for (int block = 1; block < blocks; ++block) {
    // S_j = Q K_j^T and O += P~_(j-1) V_(j-1) back to back; the softmax of S_j runs while the P.V does.
    const BlockScales block_scales = load_scales(block);
    mbarrier_wait(full_barrier(block), phase_of(block));
    turns.wait_turn();
    issue_q_k<Config>(accumulator, q_tile, stage_base(block) + Layout::kKOffset);
    issue_product(block - 1);
    turns.pass_turn(false);
    wgmma_wait_group<1>(); // S_j has landed; the P.V may still run
    warpgroup_fence_operands(accumulator);
    score(block, block_scales);
    wgmma_wait_group<0>();
    fence_product();
    finish_product(block - 1);
    pack_probabilities<Config>(p, scores);
  }
  turns.wait_turn();
  if (blocks > 0)
    issue_product(blocks - 1);
  turns.pass_turn(true);
  // Waited for on every path, so that ptxas sees O complete before anything reads it (where it cannot tell, it
  // serializes every wgmma of the kernel: C7514).
  wgmma_wait_group<0>();
  fence_product();
  if (blocks > 0)
    finish_product(blocks - 1);
  write_results<Config>(state, params, tile, rows, quad_lane);
}

template <class Config> __device__ __forceinline__ void attention_kernel(const SageSm90AttentionParams &params) {
  using Layout = SharedLayout<Config>;
  extern __shared__ __align__(1024) unsigned char shared_memory[];
  // Swizzled TMA boxes and wgmma descriptors need 1024-byte aligned tiles.
  const unsigned raw_base = static_cast<unsigned>(__cvta_generic_to_shared(shared_memory));
  const unsigned shared_base = (raw_base + 1023u) & ~1023u;
  const unsigned barriers = shared_base + Layout::kBarrierOffset;
  const TileCoordinates tile = tile_coordinates<Config>(params.base.size, params.base.causal_offset);

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < Config::kStages; ++stage) {
      mbarrier_init(barriers + stage * 8, 1); // full: the producer
      mbarrier_init(barriers + (Config::kStages + stage) * 8, Config::kConsumers * kWarpgroupThreads); // empty
    }
    mbarrier_init(barriers + 2 * Config::kStages * 8, 1); // Q_i
    mbarrier_init_fence();
  }
  __syncthreads();

  // Broadcast from lane 0 so that the compiler knows the role is warp-uniform: a wgmma under a branch it considers
  // divergent gets serialized (ptxas C7518).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    if constexpr (Config::kProducerRegisters > 0) // one consumer: no hand-over needed
      warpgroup_release_registers<Config::kProducerRegisters>();
    if (threadIdx.x == 0)
      produce<Config>(params, tile, shared_base, barriers);
  } else {
    if constexpr (Config::kConsumerRegisters > 0)
      warpgroup_claim_registers<Config::kConsumerRegisters>();
    consume<Config>(params, tile, shared_base, barriers, warpgroup - 1);
  }
}

} // namespace sage::device::sm90
