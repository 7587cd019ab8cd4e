// The epilogue of the sm80 (mma.sync) attention kernel: O_i = diag(l_i)^-1 O_i (x delta_V x P's scale for 8-bit P.V,
// + mean(V) when V was smoothed) written in the input's dtype, and the LSE (+ q . mean(K) / sqrt(d) when K was
// smoothed).
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

constexpr float kLn2 = 0.693147180559945309f;

template <class Config> struct EpilogueSteps {
  using G = Geometry<Config>;
  static constexpr int kRowTiles = G::kRowTiles, kOutputTiles = G::kOutputTiles;

  // ---- Epilogue: O_i in f32 from the f16 accumulator (two-level: plus the flushed f32 part) ----
  static __device__ __forceinline__ void collect_output(float (&output)[kRowTiles][kOutputTiles][4],
                                                        const unsigned (&o_accumulator)[kRowTiles][kOutputTiles][2],
                                                        const float (&o_flushed)[kRowTiles][kOutputTiles][4]) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int tile = 0; tile < kOutputTiles; ++tile)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          unpack_f16x2(o_accumulator[row_tile][tile][half], output[row_tile][tile][half * 2],
                       output[row_tile][tile][half * 2 + 1]);
          if constexpr (Config::kTwoLevel) {
            output[row_tile][tile][half * 2] += o_flushed[row_tile][tile][half * 2];
            output[row_tile][tile][half * 2 + 1] += o_flushed[row_tile][tile][half * 2 + 1];
          }
        }
  }

  // ---- Epilogue: O_i in f32 (two-level: the mma accumulator plus the flushed part) ----
  static __device__ __forceinline__ void collect_output(float (&output)[kRowTiles][kOutputTiles][4],
                                                        const float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                                        const float (&o_flushed)[kRowTiles][kOutputTiles][4]) {
    for_each_fragment<kRowTiles, kOutputTiles>([&](int row_tile, int tile, int i) {
      if constexpr (Config::kTwoLevel)
        output[row_tile][tile][i] = o_accumulator[row_tile][tile][i] + o_flushed[row_tile][tile][i];
      else
        output[row_tile][tile][i] = o_accumulator[row_tile][tile][i];
    });
  }

  // ---- Epilogue: O_i = diag(l_i)^-1 O_i (x delta_V x P's scale) (+ mean(V)), in f16 or bf16 ----
  // Rows past tokens_q are not written; a row that saw no visible key (l = 0) gets O = 0.
  static __device__ __forceinline__ void write_output(const float (&output)[kRowTiles][kOutputTiles][4],
                                                      const float (&row_sum)[kRowTiles][2], unsigned short *o,
                                                      long long o_row_stride, int first_row, int tokens_q,
                                                      int quad_lane, const float *v_scales, const float *v_mean) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
        if (row >= tokens_q)
          continue;
        const bool visible = row_sum[row_tile][half] > 0.0f;
        const float inverse_sum = visible ? 1.0f / row_sum[row_tile][half] : 0.0f;
#pragma unroll
        for (int tile = 0; tile < kOutputTiles; ++tile) {
          const int channel = tile * kMmaColumns + quad_lane * 2;
          float low = output[row_tile][tile][half * 2] * inverse_sum;
          float high = output[row_tile][tile][half * 2 + 1] * inverse_sum;
          if constexpr (G::kCodes) { // psi_V^-1 and P's static scale
            low *= v_scales[channel] * Config::kProbabilityScale;
            high *= v_scales[channel + 1] * Config::kProbabilityScale;
          }
          if constexpr (Config::kSmoothedV) {
            if (visible) { // V was smoothed: O = P~ (V - mean(V)) / l + mean(V)
              low += v_mean[channel];
              high += v_mean[channel + 1];
            }
          }
          if constexpr (Config::kPackedSequences) { // an empty KV sequence: O = 0 whatever its V statistics hold
            low = visible ? low : 0.0f;
            high = visible ? high : 0.0f;
          }
          if constexpr (Config::kBf16)
            *reinterpret_cast<unsigned *>(o + row * o_row_stride + channel) = pack_bf16x2(low, high);
          else
            *reinterpret_cast<unsigned *>(o + row * o_row_stride + channel) = pack_f16x2(low, high);
        }
      }
  }

  // ---- Epilogue: q . mean(K) per row, from the caller's Q ----
  // K was smoothed (K - mean(K)), which shifted every score of row i by q_i . mean(K) / sqrt(d); the LSE adds it
  // back. It is read from the caller's Q, not from Q's codes: the quantization error of q would be multiplied by
  // mean(K), which can be large (a per-channel bias of K is exactly what smoothing removes).
  static __device__ __forceinline__ void q_dot_k_mean(float (&dot)[kRowTiles][2], const unsigned short *q,
                                                      long long q_row_stride, const float *k_mean, int first_row,
                                                      int tokens_q, int quad_lane) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
        float sum = 0.0f;
        if (row < tokens_q) { // the four lanes of a quad share the row and split its channels
          const unsigned short *q_row = q + row * q_row_stride;
          for (int channel = quad_lane; channel < Config::kHeadDim; channel += 4)
            sum += decode_input_element<Config::kBf16>(q_row[channel]) * k_mean[channel];
        }
        dot[row_tile][half] = quad_sum(sum); // every lane takes part in the shuffle
      }
  }

  // ---- Epilogue: LSE_i = (m_i + log2 l_i) ln 2 + correction (natural log; -inf for a row with no visible key) ----
  static __device__ __forceinline__ void write_lse(const float (&row_max)[kRowTiles][2],
                                                   const float (&row_sum)[kRowTiles][2],
                                                   const float (&correction)[kRowTiles][2], float *lse, int first_row,
                                                   int tokens_q, int quad_lane) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
        if (quad_lane != 0 || row >= tokens_q)
          continue;
        const float sum = row_sum[row_tile][half];
        lse[row] = sum > 0.0f ? (row_max[row_tile][half] + fast_log2(sum)) * kLn2 + correction[row_tile][half]
                              : negative_infinity();
      }
  }
};

} // namespace sage::device::sm80
