// The online softmax in base 2 of the sm80 (mma.sync) attention kernel and the rescaling of the output accumulator
// it implies.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

template <class Config> struct SoftmaxSteps {
  using G = Geometry<Config>;
  static constexpr int kRowTiles = G::kRowTiles, kScoreTiles = G::kScoreTiles, kOutputTiles = G::kOutputTiles;

  // ---- Step: online softmax in base 2 ----
  // m_i^j = max(m_i^(j-1), rowmax(S_i^j)); P~_i^j = exp2(S_i^j - m_i^j) overwrites S;
  // l_i^j = exp2(m_i^(j-1) - m_i^j) l_i^(j-1) + rowsum(P~_i^j), summed in f32 before any rounding of P~.
  // row_sum is this thread's share of l_i (its own columns); the lanes of a row add theirs in the epilogue.
  // rescale returns exp2(m_i^(j-1) - m_i^j), the factor O_i^(j-1) is multiplied by.
  static __device__ __forceinline__ void online_softmax(float (&scores)[kRowTiles][kScoreTiles][4],
                                                        float (&row_max)[kRowTiles][2], float (&row_sum)[kRowTiles][2],
                                                        float (&rescale)[kRowTiles][2]) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float block_max = row_max[row_tile][half];
#pragma unroll
        for (int tile = 0; tile < kScoreTiles; ++tile)
          block_max = fmaxf(block_max, fmaxf(scores[row_tile][tile][half * 2], scores[row_tile][tile][half * 2 + 1]));
        block_max = quad_max(block_max);
        // A row that has seen only masked keys keeps m = -inf: subtract 0 then, so P~ = 0 instead of NaN.
        const float subtrahend = block_max == negative_infinity() ? 0.0f : block_max;
        rescale[row_tile][half] = fast_exp2(row_max[row_tile][half] - subtrahend);
        row_max[row_tile][half] = block_max;
        float block_sum = 0.0f;
#pragma unroll
        for (int tile = 0; tile < kScoreTiles; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            float &score = scores[row_tile][tile][half * 2 + column];
            score = fast_exp2(score - subtrahend);
            block_sum += score;
          }
        row_sum[row_tile][half] = row_sum[row_tile][half] * rescale[row_tile][half] + block_sum;
      }
  }

  // O_i^(j-1) *= exp2(m_i^(j-1) - m_i^j), on the f16 accumulator (the factor rounded to f16)
  static __device__ __forceinline__ void rescale_output(unsigned (&o_accumulator)[kRowTiles][kOutputTiles][2],
                                                        const float (&rescale)[kRowTiles][2]) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const unsigned factor = pack_f16x2(rescale[row_tile][half], rescale[row_tile][half]);
#pragma unroll
        for (int tile = 0; tile < kOutputTiles; ++tile)
          o_accumulator[row_tile][tile][half] = scale_f16x2(o_accumulator[row_tile][tile][half], factor);
      }
  }

  // O_i^(j-1) *= exp2(m_i^(j-1) - m_i^j), on an f32 accumulator
  static __device__ __forceinline__ void rescale_output(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                                        const float (&rescale)[kRowTiles][2]) {
    for_each_fragment<kRowTiles, kOutputTiles>(
        [&](int row_tile, int tile, int i) { o_accumulator[row_tile][tile][i] *= rescale[row_tile][i / 2]; });
  }
};

} // namespace sage::device::sm80
