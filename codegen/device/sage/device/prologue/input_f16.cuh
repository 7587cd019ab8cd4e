// The quantization prologue's inputs when Q, K and V are f16, handled as raw 16-bit values. The generator pastes
// this header or input_bf16.cuh (the same functions), after scalar_helpers.cuh (floatToHalfBits).
#pragma once

namespace sage::device::prologue {

__device__ __forceinline__ float inputToFloat(unsigned bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"((unsigned short)bits));
  return value;
}
// Exact on the values it is used for: minima and maxima of the input itself, and infinities.
__device__ __forceinline__ unsigned short floatToInput(float value) { return floatToHalfBits(value); }
// Round to nearest even f16: the cast that stands in for psi_Q / psi_K when they do not quantize.
__device__ __forceinline__ unsigned short roundToInput(float value) { return floatToHalfBits(value); }

// The largest |element| of a 16-byte vector of 8 inputs, as f32 (exact); a NaN never wins, as with fmaxf. Four
// f16x2 max instructions on the magnitudes instead of eight conversions and eight f32 maxima.
__device__ __forceinline__ float maxMagnitudeOf(const uint4 &vector) {
  unsigned a = vector.x & 0x7fff7fffu, b = vector.y & 0x7fff7fffu, c = vector.z & 0x7fff7fffu,
           d = vector.w & 0x7fff7fffu;
  asm("max.f16x2 %0, %0, %1;" : "+r"(a) : "r"(b));
  asm("max.f16x2 %0, %0, %1;" : "+r"(c) : "r"(d));
  asm("max.f16x2 %0, %0, %1;" : "+r"(a) : "r"(c));
  return fmaxf(fmaxf(0.0f, inputToFloat(a & 0xffffu)), inputToFloat(a >> 16)); // 0 when both are NaN
}

// Element-wise minimum and maximum of two f16x2 words (a NaN never wins, as with fminf and fmaxf): the column
// statistics reduce the inputs as they are, which is exact.
__device__ __forceinline__ unsigned minOfPairs(unsigned a, unsigned b) {
  unsigned result;
  asm("min.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
__device__ __forceinline__ unsigned maxOfPairs(unsigned a, unsigned b) {
  unsigned result;
  asm("max.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
// +inf and -inf in both halves: the identities of minOfPairs and maxOfPairs.
[[maybe_unused]] constexpr unsigned kPositiveInfinityPair = 0x7c007c00u;
[[maybe_unused]] constexpr unsigned kNegativeInfinityPair = 0xfc00fc00u;

} // namespace sage::device::prologue
