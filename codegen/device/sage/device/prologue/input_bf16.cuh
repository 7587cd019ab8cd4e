// The quantization prologue's inputs when Q, K and V are bf16, handled as raw 16-bit values. The generator pastes
// this header or input_f16.cuh (the same functions), after scalar_helpers.cuh.
#pragma once

namespace sage::device::prologue {

__device__ __forceinline__ float inputToFloat(unsigned bits) { return __uint_as_float(bits << 16); }
// Exact on the values it is used for: minima and maxima of the input itself, and infinities.
__device__ __forceinline__ unsigned short floatToInput(float value) {
  return (unsigned short)(__float_as_uint(value) >> 16);
}
// Round to nearest even bf16: the cast that stands in for psi_Q / psi_K when they do not quantize.
__device__ __forceinline__ unsigned short roundToInput(float value) {
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}

// The largest |element| of a 16-byte vector of 8 inputs, as f32 (exact); a NaN never wins, as with fmaxf. Four
// bf16x2 max instructions on the magnitudes instead of eight conversions and eight f32 maxima.
__device__ __forceinline__ float maxMagnitudeOf(const uint4 &vector) {
  unsigned a = vector.x & 0x7fff7fffu, b = vector.y & 0x7fff7fffu, c = vector.z & 0x7fff7fffu,
           d = vector.w & 0x7fff7fffu;
  asm("max.bf16x2 %0, %0, %1;" : "+r"(a) : "r"(b));
  asm("max.bf16x2 %0, %0, %1;" : "+r"(c) : "r"(d));
  asm("max.bf16x2 %0, %0, %1;" : "+r"(a) : "r"(c));
  return fmaxf(fmaxf(0.0f, inputToFloat(a & 0xffffu)), inputToFloat(a >> 16)); // 0 when both are NaN
}

// Element-wise minimum and maximum of two bf16x2 words (a NaN never wins, as with fminf and fmaxf): the column
// statistics reduce the inputs as they are, which is exact.
__device__ __forceinline__ unsigned minOfPairs(unsigned a, unsigned b) {
  unsigned result;
  asm("min.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
__device__ __forceinline__ unsigned maxOfPairs(unsigned a, unsigned b) {
  unsigned result;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
// +inf and -inf in both halves: the identities of minOfPairs and maxOfPairs.
[[maybe_unused]] constexpr unsigned kPositiveInfinityPair = 0x7f807f80u;
[[maybe_unused]] constexpr unsigned kNegativeInfinityPair = 0xff80ff80u;

} // namespace sage::device::prologue
