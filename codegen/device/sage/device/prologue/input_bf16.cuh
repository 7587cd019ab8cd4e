// The quantization prologue's inputs when Q, K and V are bf16, handled as raw 16-bit values. The generator pastes
// this header or input_f16.cuh (the same three functions), after scalar_helpers.cuh.
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

} // namespace sage::device::prologue
