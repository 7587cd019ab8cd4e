// Steps of the sm80 (mma.sync) attention kernel up to S_i^j: Q_i's fragments and scales, S = Q K^T with mma.sync,
// dequantization into the exponent's base-2 domain, Q smoothing's correction and the mask.
#pragma once

#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

template <class Config> struct ScoreSteps {
  using G = Geometry<Config>;
  using ScoreAccumulator = typename G::ScoreAccumulator;
  using ScoreColumns = typename G::Columns;
  static constexpr int kRowTiles = G::kRowTiles, kScoreTiles = G::kScoreTiles, kQkSteps = G::kQkSteps;
  using QFragments = unsigned[G::kQFragmentTiles][G::kQFragmentSteps][4];

  // This lane's address offset in Q_i's shared tile for the ldmatrix.x4 of Q's A fragments: lanes 0-7 address rows
  // 0-7 of a step's first 16 bytes, lanes 8-15 rows 8-15, lanes 16-31 the same rows' next 16 bytes.
  static __device__ __forceinline__ unsigned q_lane_offset(int warp, int lane) {
    const int matrix = lane / kLdmatrixRows;
    return swizzled_offset<Config::kQRowBytes / kChunkBytes>(
        warp * G::kRowsPerWarp + (matrix % 2) * kRowHalf + lane % kLdmatrixRows, matrix / 2);
  }

  // The A fragment of row tile `row_tile`, k step `step` of Q_i, read from its shared tile
  static __device__ __forceinline__ void load_q_fragment(unsigned (&fragment)[4], unsigned q_tile, unsigned lane_offset,
                                                         int row_tile, int step) {
    ldmatrix_x4(fragment, tile_address(q_tile, lane_offset, row_tile * kMmaRows * Config::kQRowBytes,
                                       step * (kQkStepBytes / kChunkBytes)));
  }

  // ---- Step: Q_i into registers, kept there for the whole KV loop (unless G::kQFromShared) ----
  // q_fragment[row tile][k step] is the A operand of one Q.K^T mma.
  static __device__ __forceinline__ void load_q_fragments(QFragments &q_fragment, unsigned q_tile,
                                                          unsigned lane_offset) {
    if constexpr (!G::kQFromShared)
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
        for (int step = 0; step < kQkSteps; ++step)
          load_q_fragment(q_fragment[row_tile][step], q_tile, lane_offset, row_tile, step);
  }

  // ---- Step: delta_Q of the rows this thread holds (rows g and g + 8 of each row tile) ----
  static __device__ __forceinline__ void load_q_row_scales(float (&q_row_scale)[kRowTiles][2], const float *q_scales,
                                                           int first_row) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        q_row_scale[row_tile][half] = q_scales[scale_group<Config::kQScaleTokensPerGroup, Config::kQScaleInterleave>(
            first_row + row_tile * kMmaRows + half * kRowHalf)];
  }

  // ---- Step: S_i^j = Q_i K_j^T ----
  // K_j's rows (token-major, like the tile) are the B operand's "col" layout. One ldmatrix.x4 gives both k-halves of
  // two n8 tiles: matrix m covers tile (pair + m / 2), bytes (m % 2) * 16 of the k step.
  // Q's fragments come from `q_fragment`, or (G::kQFromShared) from Q_i's shared tile, one k step at a time.
  static __device__ __forceinline__ void multiply_q_k(ScoreAccumulator (&score_accumulator)[kRowTiles][kScoreTiles][4],
                                                      const QFragments &q_fragment, unsigned q_tile,
                                                      unsigned q_lane_offset, unsigned k_tile, int lane) {
    constexpr int kRowChunks = Config::kKRowBytes / kChunkBytes;
    constexpr int kTilePairRows = 2 * kMmaColumns; // KV tokens of two n8 tiles
    const int matrix = lane / kLdmatrixRows;
    // Token of this lane's ldmatrix row in tile pair 0; pair p adds p * 16 tokens (kv_token_of_column keeps that).
    const unsigned lane_offset =
        swizzled_offset<kRowChunks>(ScoreColumns::kv_token_of_column(matrix / 2, lane % kLdmatrixRows), matrix % 2);
    for_each_fragment<kRowTiles, kScoreTiles>(
        [&](int row_tile, int tile, int i) { score_accumulator[row_tile][tile][i] = 0; });
#pragma unroll
    for (int step = 0; step < kQkSteps; ++step) {
      unsigned q_step[kRowTiles][4];
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
        if constexpr (G::kQFromShared) {
          load_q_fragment(q_step[row_tile], q_tile, q_lane_offset, row_tile, step);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            q_step[row_tile][i] = q_fragment[row_tile][step][i];
        }
      }
#pragma unroll
      for (int tile = 0; tile < kScoreTiles; tile += 2) {
        unsigned k_fragment[4];
        ldmatrix_x4(k_fragment, tile_address(k_tile, lane_offset, (tile / 2) * kTilePairRows * Config::kKRowBytes,
                                             step * (kQkStepBytes / kChunkBytes)));
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
          qk_mma<Config>(score_accumulator[row_tile][tile], q_step[row_tile], k_fragment[0], k_fragment[1]);
          qk_mma<Config>(score_accumulator[row_tile][tile + 1], q_step[row_tile], k_fragment[2], k_fragment[3]);
        }
      }
    }
  }

  // ---- Step: S_i^j = Q_i K_j^T in the exponent's base-2 domain (Q and K unquantized) ----
  static __device__ __forceinline__ void
  dequantize_scores(float (&scores)[kRowTiles][kScoreTiles][4],
                    const ScoreAccumulator (&score_accumulator)[kRowTiles][kScoreTiles][4],
                    const float (&row_factor)[kRowTiles][2]) {
    static_assert(!Config::kQuantizedQk, "quantized Q/K: the dequantization takes K's scales");
    for_each_fragment<kRowTiles, kScoreTiles>([&](int row_tile, int tile, int i) {
      scores[row_tile][tile][i] = score_accumulator[row_tile][tile][i] * row_factor[row_tile][i / 2];
    });
  }

  // ---- Step: S_i^j = psi^-1(Q^_i K^_j^T) in the exponent's base-2 domain ----
  // One K scale for the whole block: S = s32 * (delta_Q of the row * domain factor) * delta_K
  static __device__ __forceinline__ void
  dequantize_scores(float (&scores)[kRowTiles][kScoreTiles][4],
                    const ScoreAccumulator (&score_accumulator)[kRowTiles][kScoreTiles][4],
                    const float (&row_factor)[kRowTiles][2], float k_block_scale) {
    static_assert(Config::kQuantizedQk && !Config::kStagedKScales, "one K scale per KV block");
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float factor = row_factor[row_tile][half] * k_block_scale;
#pragma unroll
        for (int tile = 0; tile < kScoreTiles; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column)
            scores[row_tile][tile][half * 2 + column] =
                static_cast<float>(score_accumulator[row_tile][tile][half * 2 + column]) * factor;
      }
  }

  // ---- Step: S_i^j = psi^-1(Q^_i K^_j^T) in the exponent's base-2 domain ----
  // K's scales vary inside the block: they sit in this stage's shared memory, slot group(token) - group(kv_begin).
  static __device__ __forceinline__ void
  dequantize_scores(float (&scores)[kRowTiles][kScoreTiles][4],
                    const ScoreAccumulator (&score_accumulator)[kRowTiles][kScoreTiles][4],
                    const float (&row_factor)[kRowTiles][2], const float *k_block_scales, int kv_begin, int quad_lane) {
    static_assert(Config::kQuantizedQk && Config::kStagedKScales, "K's scales staged per KV block");
    const int first_group = scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(kv_begin);
#pragma unroll
    for (int tile = 0; tile < kScoreTiles; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        const int token = kv_begin + ScoreColumns::kv_token_of_column(tile, quad_lane * 2 + column);
        const float k_scale =
            k_block_scales[scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(token) - first_group];
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            scores[row_tile][tile][half * 2 + column] =
                static_cast<float>(score_accumulator[row_tile][tile][half * 2 + column]) *
                (row_factor[row_tile][half] * k_scale);
      }
  }

  // ---- Step: S_i^j += mean(Q_i) K_j^T, Q smoothing's correction (sage.q_mean_correction) ----
  // delta_s: the prologue's GEMV for this CTA's Q block, indexed by KV token; `factor` puts it in S's domain.
  static __device__ __forceinline__ void add_q_mean_correction(float (&scores)[kRowTiles][kScoreTiles][4],
                                                               const float *delta_s, float factor, int quad_lane) {
#pragma unroll
    for (int tile = 0; tile < kScoreTiles; ++tile)
#pragma unroll
      for (int column = 0; column < 2; ++column) {
        const float delta = delta_s[ScoreColumns::kv_token_of_column(tile, quad_lane * 2 + column)] * factor;
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            scores[row_tile][tile][half * 2 + column] += delta;
      }
  }

  // ---- Step: mask S_i^j ----
  // Tokens past the end of the sequence, and when causal the tokens after a row's diagonal (token j is visible to
  // row i iff j <= i + causal_offset: tokens_kv - tokens_q aligns bottom-right, 0 top-left), get -inf.
  static __device__ __forceinline__ void mask_scores(float (&scores)[kRowTiles][kScoreTiles][4], int first_row,
                                                     int kv_begin, int tokens_kv, int causal_offset, int quad_lane) {
    for_each_fragment<kRowTiles, kScoreTiles>([&](int row_tile, int tile, int i) {
      const int token = kv_begin + ScoreColumns::kv_token_of_column(tile, quad_lane * 2 + i % 2);
      const int row = first_row + row_tile * kMmaRows + (i / 2) * kRowHalf;
      bool visible = token < tokens_kv;
      if (Config::kCausal)
        visible = visible && token <= row + causal_offset;
      if (!visible)
        scores[row_tile][tile][i] = negative_infinity();
    });
  }
};

} // namespace sage::device::sm80
