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

// Element-wise maximum (kMax) or minimum of two f16x2 words; a NaN never wins, as with fmaxf and fminf. Exact:
// the column statistics and the row amax reduce the inputs as they are.
template <bool kMax> __device__ __forceinline__ unsigned extremeOfPairs(unsigned a, unsigned b) {
  unsigned result;
  if constexpr (kMax)
    asm("max.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  else
    asm("min.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
// +inf and -inf in both halves: the identities of the minimum and the maximum.
[[maybe_unused]] constexpr unsigned kPositiveInfinityPair = 0x7c007c00u;
[[maybe_unused]] constexpr unsigned kNegativeInfinityPair = 0xfc00fc00u;

} // namespace sage::device::prologue
