// The scalar PTX atoms every mma family shares (sm80, sm90, hence sm120 and SLA): the special functions ex2/lg2, the
// packing conversions between f32 and the mma operand types (f16, bf16, s8, e4m3), and an input element as f32. One
// copy: the sm80 and sm90 kernels compute the same function with the same instructions.
#pragma once

namespace sage::device {

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

} // namespace sage::device
