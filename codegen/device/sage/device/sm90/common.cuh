// Scalar helpers of the sm90 attention kernels. The special functions and the packing conversions between f32 and the
// mma operand types are sage/device/conversions.cuh (shared with the sm80 kernel, so both schedules compute the same
// function), the quad reductions sage/device/lanes.cuh; this file names them in sage::device::sm90.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/lanes.cuh"

namespace sage::device::sm90 {

using sage::device::decode_input_element;
using sage::device::fast_exp2;
using sage::device::fast_log2;
using sage::device::negative_infinity;
using sage::device::pack_bf16x2;
using sage::device::pack_e4m3x4;
using sage::device::pack_f16x2;
using sage::device::pack_s8x4;
using sage::device::quad_max;
using sage::device::quad_sum;
using sage::device::scale_f16x2;
using sage::device::unpack_f16x2;

// NVRTC compiles without the standard library: the one type trait the kernels need.
template <bool kCondition, class IfTrue, class IfFalse> struct SelectType { using type = IfTrue; };
template <class IfTrue, class IfFalse> struct SelectType<false, IfTrue, IfFalse> { using type = IfFalse; };
template <bool kCondition, class IfTrue, class IfFalse>
using Select = typename SelectType<kCondition, IfTrue, IfFalse>::type;

// An s32 as f32, exactly for |x| < 2^24 (callers keep |x| < 2^22): one I2FP. Measured on the H100 (2026-11-24,
// 64 independent conversions + FFMA per thread): 34 per SM per clock, against 29 for the integer-add-and-FADD trick
// (0x4B400000 = 1.5 x 2^23) it replaces: the conversion is not quarter-rate here, and it is one instruction, not two.
__device__ __forceinline__ float small_int_to_float(int x) { return __int2float_rn(x); }

// 8-bit wgmma A fragments packed from an accumulator without moving data (tiles 4s, 4s + 1 of a thread's row give
// k = 4t .. 4t + 3 of k step s): the column (token) that k position `position` (0 .. 31) of a step then holds. A B
// operand whose tokens are stored in this order makes the product the natural one.
__host__ __device__ constexpr int accumulator_token_of_k_position(int position) {
  const int half = position / 16, lane_quad = position % 16 / 4, byte = position % 4;
  return 16 * half + (byte < 2 ? 2 * lane_quad + byte : 8 + 2 * lane_quad + byte - 2);
}

// ---- Reductions over the 4 lanes that hold one accumulator row (PTX: threadID_in_group) ----
// The LSE correction of a smoothed K for one row: every score of the row moved by q . mean(K) * softmax scale. Read
// from the caller's Q (the quantization error of q times mean(K) would not be small); the quad's four lanes split
// the channels and all get the sum. `q_row` may be out of range when !valid (it is not read then).
template <int kHeadDim, bool kBf16>
__device__ __forceinline__ float smoothed_k_lse_correction(const unsigned short *q_row, const float *k_mean, bool valid,
                                                           int quad_lane, float softmax_scale) {
  float sum = 0.0f;
  if (valid)
    for (int channel = quad_lane; channel < kHeadDim; channel += 4)
      sum += decode_input_element<kBf16>(q_row[channel]) * k_mean[channel];
  return quad_sum(sum) * softmax_scale;
}

// The LSE of a thread's two rows, written by quad lane 0 (natural log; -inf for a row with no visible key):
// (m + log2 l - log2_offset) ln 2, plus smoothed_k_lse_correction when K was smoothed (Config::kLseCorrection).
// `params`: SageAttentionParams; `tile`: the CTA's batch, head, kv_head_index, and its sequence's tokens_q and first
// row q_base (dense: the call's tokens_q and 0); `row_sum` already summed over the quad. Element (b, h, t) of the LSE
// is at lse[b lse_strides.batch + h lse_strides.head + t], t counted from q_base. The sm90 and sm120 attention
// kernels' epilogue.
template <class Config, class Params, class Tile>
__device__ __forceinline__ void write_lse(const Params &params, const Tile &tile, const int (&rows)[2],
                                          const float (&row_max)[2], const float (&row_sum)[2], int quad_lane,
                                          float log2_offset) {
  constexpr float kLn2 = 0.693147180559945309f;
  float *lse = params.lse + tile.batch * params.lse_strides.batch + tile.head * params.lse_strides.head + tile.q_base;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = rows[half];
    float correction = 0.0f;
    if constexpr (Config::kLseCorrection) {
      // K was smoothed: every score of row i moved by q_i . mean(K) / sqrt(d), read from the caller's Q.
      const float *k_mean = reinterpret_cast<const float *>(params.workspace + params.offsets.k_mean) +
                            tile.kv_head_index * Config::kHeadDim;
      const unsigned short *q = static_cast<const unsigned short *>(params.q) + tile.batch * params.q_strides.batch +
                                tile.head * params.q_strides.head + tile.q_base * params.q_strides.token;
      correction = smoothed_k_lse_correction<Config::kHeadDim, Config::kBf16>(
          q + row * params.q_strides.token, k_mean, row < tile.tokens_q, quad_lane, params.softmax_scale);
    }
    if (quad_lane != 0 || row >= tile.tokens_q)
      continue;
    const float sum = row_sum[half];
    lse[row] = sum > 0.0f ? (row_max[half] + fast_log2(sum) - log2_offset) * kLn2 + correction : negative_infinity();
  }
}

} // namespace sage::device::sm90
