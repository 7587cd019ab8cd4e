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

// Element-wise maximum (kMax) or minimum of two bf16x2 words; a NaN never wins, as with fmaxf and fminf. Exact:
// the column statistics and the row amax reduce the inputs as they are.
template <bool kMax> __device__ __forceinline__ unsigned extremeOfPairs(unsigned a, unsigned b) {
  unsigned result;
  if constexpr (kMax)
    asm("max.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  else
    asm("min.bf16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
// +inf and -inf in both halves: the identities of the minimum and the maximum.
[[maybe_unused]] constexpr unsigned kPositiveInfinityPair = 0x7f807f80u;
[[maybe_unused]] constexpr unsigned kNegativeInfinityPair = 0xff80ff80u;

} // namespace sage::device::prologue
