// The quantization prologue's int8 and int4 codes: round, saturate and pack the f32 products x * inverse of one
// 8-channel row vector. Needs nothing from the generated code.
#pragma once

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

// Eight codes of one row vector, channel j in byte j.
__device__ __forceinline__ uint2 packInt8Codes(const float (&scaled)[8]) {
  uint2 packed = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed.x |= int8Code(scaled[j]) << (8 * j);
    packed.y |= int8Code(scaled[j + 4]) << (8 * j);
  }
  return packed;
}

} // namespace sage::device::prologue
