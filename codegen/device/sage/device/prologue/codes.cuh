// The quantization prologue's int8 and int4 codes: round, saturate and pack the f32 products x * inverse of one
// 8-channel row vector. Needs nothing from the generated code.
#pragma once

#include "sage/device/conversions.cuh"

namespace sage::device::prologue {

// int8: cvt.rni (round half to even) of the f32 product, saturated to [-127, 127]; a NaN becomes 0.
__device__ __forceinline__ unsigned int8Code(float scaled) {
  int code;
  asm("cvt.rni.sat.s32.f32 %0, %1;" : "=r"(code) : "f"(scaled));
  return (unsigned)(code < -127 ? -127 : code > 127 ? 127 : code) & 0xffu;
}

// int4, stored one per byte (the legalized s4 -> s8 operand): cvt.rni of the f32 product, saturated to [-7, 7]
// (symmetric, as roundToInt4); a NaN becomes 0.
__device__ __forceinline__ unsigned int4Code(float scaled) {
  int code;
  asm("cvt.rni.sat.s32.f32 %0, %1;" : "=r"(code) : "f"(scaled));
  return (unsigned)(code < -7 ? -7 : code > 7 ? 7 : code) & 0xffu;
}

__device__ __forceinline__ uint2 packInt4Codes(const float (&scaled)[8]) {
  uint2 packed = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed.x |= int4Code(scaled[j]) << (8 * j);
    packed.y |= int4Code(scaled[j + 4]) << (8 * j);
  }
  return packed;
}

// Four int8Code codes in one word, `a` in the low byte (the saturation as in packInt8Codes).
__device__ __forceinline__ unsigned int8Codes4(float a, float b, float c, float d) { return pack_s8x4(a, b, c, d); }

// Eight codes of one row vector, channel j in byte j: int8Code's codes, in 12 instructions instead of 36. The
// saturation of pack_s8x4 goes to -128 where int8Code's goes to -127, which never differs here: x * inverse with
// |x| <= amax (over the group, or the channel for V) and
// inverse = fl(127 / amax) stays within 127 * (1 + 2^-23), so it rounds to at most 127 in magnitude.
__device__ __forceinline__ uint2 packInt8Codes(const float (&scaled)[8]) {
  return {pack_s8x4(scaled[0], scaled[1], scaled[2], scaled[3]), pack_s8x4(scaled[4], scaled[5], scaled[6], scaled[7])};
}

} // namespace sage::device::prologue
