// From S to P~ in a consumer's registers: dequantization of the Q.K^T accumulators, the mask, the online softmax
// (base 2), and P~ packed as the register A operand of the P.V wgmma.
#pragma once

#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/tiles.cuh"

namespace sage::device::sm90 {

// Pairwise (tree) reduction of a thread's share of one row, in place: the compares or adds form log2(kCount)
// dependent steps instead of one serial chain. A consumer has one warp per scheduler (or two, with the other
// warpgroup's), so the softmax's latencies are hidden by its own independent instructions or not at all.
template <int kCount, class Op> __device__ __forceinline__ float tree_reduce(float (&values)[kCount], Op op) {
#pragma unroll
  for (int stride = 1; stride < kCount; stride *= 2)
#pragma unroll
    for (int i = 0; i + stride < kCount; i += 2 * stride)
      values[i] = op(values[i], values[i + stride]);
  return values[0];
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

// The largest and the sum of row half `half`'s scores in tiles [first_tile, first_tile + kTiles) of an accumulator
// (registers 4 tile + 2 half, 4 tile + 2 half + 1). Callers pass constants (unrolled loops): the indices fold.
template <int kTiles, class Op, int kCount>
__device__ __forceinline__ float reduce_half_row(const float (&scores)[kCount], int half, int first_tile, Op op) {
  float values[2 * kTiles];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
    for (int column = 0; column < 2; ++column)
      values[2 * tile + column] = scores[(first_tile + tile) * 4 + half * 2 + column];
  return tree_reduce(values, op);
}
template <int kTiles, int kCount>
__device__ __forceinline__ float half_row_max(const float (&scores)[kCount], int half, int first_tile = 0) {
  return reduce_half_row<kTiles>(scores, half, first_tile, MaxOp{});
}
template <int kTiles, int kCount>
__device__ __forceinline__ float half_row_sum(const float (&scores)[kCount], int half, int first_tile = 0) {
  return reduce_half_row<kTiles>(scores, half, first_tile, SumOp{});
}

template <class Config>
__device__ __forceinline__ float k_column_scale(const float *k_scales, int k_scale_count, int token) {
  int group = scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(token);
  group = group < k_scale_count ? group : k_scale_count - 1; // tiles may reach past the padded sequence
  return __ldg(k_scales + group);
}

// int8 S (s32 accumulator) -> f32 scores in the base-2 domain: score = S x row_factor x delta_K(column), for K scales
// that vary inside an 8-column tile (per-thread groups); CodesSoftmax handles the rest.
template <class Config>
__device__ __forceinline__ void
dequantize_scores(float (&scores)[Config::kBlockKv / 2], const int (&accumulator)[Config::kBlockKv / 2],
                  const float (&row_factor)[2], const float *k_scales, int k_scale_count, int kv_begin, int quad_lane) {
  constexpr int kTiles = Config::kBlockKv / 8;
  static_assert(Config::kHeadDim * 127 * 127 < (1 << 22), "s32 scores too large for small_int_to_float");
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
  constexpr int kTiles = Config::kBlockKv / 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float block_max = quad_max(fmaxf(row_max[half], half_row_max<kTiles>(scores, half)));
    // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
    const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
    rescale[half] = fast_exp2(row_max[half] - subtrahend);
    row_max[half] = block_max;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        float &score = scores[tile * 4 + half * 2 + column];
        score = fast_exp2(score - (subtrahend - Config::kProbabilityCodeLog2));
      }
    row_sum[half] = row_sum[half] * rescale[half] + half_row_sum<kTiles>(scores, half);
  }
}

// The online softmax straight from f16/bf16 Q.K^T's f32 accumulators: the row factor (> 0: the softmax scale is
// checked positive) commutes with the max, so the max is taken on S and the factor goes into the exponent's FFMA,
// P~ = exp2(S f - (m - log2 of P's code scale)): one multiply per score fewer than scaling S first.
template <class Config>
__device__ __forceinline__ void online_softmax_scaled(float (&scores)[Config::kBlockKv / 2],
                                                      const float (&row_factor)[2], float (&row_max)[2],
                                                      float (&row_sum)[2], float (&rescale)[2]) {
#pragma unroll
  constexpr int kTiles = Config::kBlockKv / 8;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float block_max = fmaxf(row_max[half], quad_max(half_row_max<kTiles>(scores, half)) * row_factor[half]);
    // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
    const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
    rescale[half] = fast_exp2(row_max[half] - subtrahend);
    row_max[half] = block_max;
    const float shift = subtrahend - Config::kProbabilityCodeLog2;
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        float &score = scores[tile * 4 + half * 2 + column];
        score = fast_exp2(fmaf(score, row_factor[half], -shift));
      }
    row_sum[half] = row_sum[half] * rescale[half] + half_row_sum<kTiles>(scores, half);
  }
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
  static __device__ __forceinline__ void run(ConsumerState<Config> &state, float (&x)[Config::kBlockKv / 2],
                                             const int (&accumulator)[Config::kBlockKv / 2],
                                             const TileCoordinates &tile, const BlockScales &scales,
                                             const int (&rows)[2], int kv_begin, int quad_lane, float (&rescale)[2]) {
    const float(&k_scale)[kGroups] = scales.k_scale;
#pragma unroll
    for (int i = 0; i < Config::kBlockKv / 2; ++i)
      x[i] = __int_as_float(accumulator[i] + 0x4B400000);
    if constexpr (kMasked) // -inf stays -inf through the FFMA below (the factor is made positive there)
      mask_scores<Config>(x, rows, kv_begin, tile.tokens_kv, tile.causal_offset, quad_lane);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float block_max = state.row_max[half];
      float factor[kGroups];
#pragma unroll
      for (int group = 0; group < kGroups; ++group) {
        factor[group] = state.row_factor[half] * k_scale[group];
        // A zero factor (an all-zero Q block or K group: scale 0, codes 0) would turn a masked -inf into NaN. Its
        // keys' S are 0 whatever the factor, so the smallest normal float changes no visible score (the FFMA below
        // rounds kOffset x FLT_MIN away) and keeps -inf. Packed sequences meet it in every scale group past a
        // sequence (written 0); a dense call where a tail group's K - mean(K) is all zero.
        if constexpr (kMasked)
          factor[group] = fmaxf(factor[group], 1.17549435e-38f);
        const float group_max = half_row_max<kTilesPerGroup>(x, half, group * kTilesPerGroup);
        if (group_max != negative_infinity())
          block_max = fmaxf(block_max, (group_max - kOffset) * factor[group]);
      }
      block_max = quad_max(block_max);
      // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
      const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
      rescale[half] = fast_exp2(state.row_max[half] - subtrahend);
      state.row_max[half] = block_max;
#pragma unroll
      for (int group = 0; group < kGroups; ++group) {
        const float shift = kOffset * factor[group] + (subtrahend - Config::kProbabilityCodeLog2);
#pragma unroll
        for (int tile = group * kTilesPerGroup; tile < (group + 1) * kTilesPerGroup; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            float &score = x[tile * 4 + half * 2 + column];
            score = fast_exp2(fmaf(score, factor[group], -shift));
          }
      }
      state.row_sum[half] = state.row_sum[half] * rescale[half] + half_row_sum<kTiles>(x, half);
    }
  }
};

// S_i^j (waited for) -> P~_i^j's scores in f32: dequantization, the mask when kMasked, the online softmax.
template <class Config, bool kMasked, class Accumulator>
__device__ __forceinline__ void score_block(ConsumerState<Config> &state, float (&scores)[Config::kBlockKv / 2],
                                            const Accumulator (&accumulator)[Config::kBlockKv / 2],
                                            const SageProblemSize &size, const TileCoordinates &tile,
                                            const float *k_scales,
                                            const typename CodesSoftmax<Config>::BlockScales &block_scales,
                                            const int (&rows)[2], int kv_begin, int quad_lane, float (&rescale)[2]) {
  if constexpr (CodesSoftmax<Config>::kApplies) {
    CodesSoftmax<Config>::template run<kMasked>(state, scores, accumulator, tile, block_scales, rows, kv_begin,
                                                quad_lane, rescale);
  } else if constexpr (Config::kQk != QkOperands::int8) {
#pragma unroll
    for (int i = 0; i < Config::kBlockKv / 2; ++i)
      scores[i] = accumulator[i];
    if constexpr (kMasked) // -inf stays -inf through the FFMA (the factor is positive)
      mask_scores<Config>(scores, rows, kv_begin, tile.tokens_kv, tile.causal_offset, quad_lane);
    online_softmax_scaled<Config>(scores, state.row_factor, state.row_max, state.row_sum, rescale);
  } else {
    dequantize_scores<Config>(scores, accumulator, state.row_factor, k_scales, size.k_scale_count, kv_begin, quad_lane);
    if constexpr (kMasked)
      mask_scores<Config>(scores, rows, kv_begin, tile.tokens_kv, tile.causal_offset, quad_lane);
    online_softmax<Config>(scores, state.row_max, state.row_sum, rescale);
  }
}

} // namespace sage::device::sm90
