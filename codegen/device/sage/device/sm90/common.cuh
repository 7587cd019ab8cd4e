// Scalar helpers of the sm90 attention kernels: special functions, the packing conversions between f32 and the mma
// operand types (the quad reductions come from sage/device/lanes.cuh). The numerics are those of the
// sm80 kernels (codegen/src/ConversionEmitter.cpp), so both schedules compute the same function.
#pragma once

#include "sage/device/lanes.cuh"

namespace sage::device::sm90 {

using sage::device::negative_infinity;
using sage::device::quad_max;
using sage::device::quad_sum;

// NVRTC compiles without the standard library: the one type trait the kernels need.
template <bool kCondition, class IfTrue, class IfFalse> struct SelectType { using type = IfTrue; };
template <class IfTrue, class IfFalse> struct SelectType<false, IfTrue, IfFalse> { using type = IfFalse; };
template <bool kCondition, class IfTrue, class IfFalse>
using Select = typename SelectType<kCondition, IfTrue, IfFalse>::type;

// 2^x (ex2.approx.ftz: 2 ulp, flushes denormals; 2^-inf = +0)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) (lg2.approx.ftz)
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two f32 -> one f16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_f16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// Two f32 -> one bf16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_bf16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// One f16x2 register -> two f32 (exact)
__device__ __forceinline__ void unpack_f16x2(unsigned packed, float &low, float &high) {
  asm("{\n"
      "  .reg .f16 low_half, high_half;\n"
      "  mov.b32 {low_half, high_half}, %2;\n"
      "  cvt.f32.f16 %0, low_half;\n"
      "  cvt.f32.f16 %1, high_half;\n"
      "}\n"
      : "=f"(low), "=f"(high)
      : "r"(packed));
}

// Both halves of an f16x2 register times the halves of `factor` (mul.rn.f16x2)
__device__ __forceinline__ unsigned scale_f16x2(unsigned value, unsigned factor) {
  unsigned product;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(product) : "r"(value), "r"(factor));
  return product;
}

// Four f32 -> four saturated int8 codes (round to nearest even) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_s8x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .s32 code0, code1, code2, code3;\n"
      "  .reg .b32 upper;\n"
      "  cvt.rni.s32.f32 code0, %1;\n"
      "  cvt.rni.s32.f32 code1, %2;\n"
      "  cvt.rni.s32.f32 code2, %3;\n"
      "  cvt.rni.s32.f32 code3, %4;\n"
      "  cvt.pack.sat.s8.s32.b32 upper, code3, code2, 0;\n"
      "  cvt.pack.sat.s8.s32.b32 %0, code1, code0, upper;\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

// Four f32 -> four e4m3 codes (round to nearest even, saturate to +-448) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_e4m3x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .b16 low_pair, high_pair;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 low_pair, %2, %1;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 high_pair, %4, %3;\n"
      "  mov.b32 %0, {low_pair, high_pair};\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

// An f16 or bf16 element of the caller's tensors as f32 (exact)
template <bool kBf16> __device__ __forceinline__ float decode_input_element(unsigned short bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<unsigned>(bits) << 16); // bf16 is the top half of an f32
  } else {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
  }
}

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

} // namespace sage::device::sm90
