// The f32 arithmetic of the quantization prologue's quantizers (sage/numerics/Quantizers.h) and the f32 -> f16
// rounding. Needs nothing from the generated code.
#pragma once

namespace sage::device::prologue {

// __fadd_rn, __fsub_rn, __fmul_rn and __fdiv_rn are single IEEE operations, never contracted into an FMA or
// approximated, so codes and scales match the CPU quantizers bit for bit from the same f32 inputs.
struct SymmetricScale {
  float scale;   // dequantize: x ~= code * scale
  float inverse; // quantize:   code = round(x * inverse)
};

// scale = amax / qmax and inverse = qmax / amax, one f32 division each; an all-zero group gets 0 and 0.
__device__ __forceinline__ SymmetricScale symmetricScale(float amax, float code_max) {
  if (amax == 0.0f)
    return {0.0f, 0.0f};
  return {__fdiv_rn(amax, code_max), __fdiv_rn(code_max, amax)};
}

__device__ __forceinline__ float positiveInfinity() { return __int_as_float(0x7f800000); }

// Round to nearest even f16 (a NaN becomes 0x7fff, as sage::numerics::floatToHalfBits).
__device__ __forceinline__ unsigned short floatToHalfBits(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}

} // namespace sage::device::prologue
