// The quantization prologue's inputs when Q, K and V are f16, handled as raw 16-bit values. The generator pastes
// this header or input_bf16.cuh (the same three functions), after scalar_helpers.cuh (floatToHalfBits).
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

} // namespace sage::device::prologue
