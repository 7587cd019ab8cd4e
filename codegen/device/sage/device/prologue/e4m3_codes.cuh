// The quantization prologue's e4m3 codes: cvt.rn.satfinite.e4m3x2 on sm_89 and later, the same rounding in integer
// arithmetic below that. The generator pastes this header only for variants with e4m3 codes.
#pragma once

namespace sage::device::prologue {

// cvt.rn.satfinite.e4m3 in integer arithmetic, for GPUs without the instruction (sm_80, sm_86): round half
// to even, clamp to +-448 (infinities included), NaN -> 0x7f, zero keeps its sign.
__device__ __forceinline__ unsigned encodeE4m3Software(float value) {
  const unsigned bits = __float_as_uint(value);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return 0x7fu; // NaN
  if (magnitude >= 0x43e00000u)
    return sign | 0x7eu; // >= 448: every such value rounds to 448 or saturates to it
  if (magnitude < 0x3c800000u) {
    // Below 2^-6, E4M3 steps by 2^-9: scale exactly by 2^9 and round half to even (8 is the smallest normal).
    int steps;
    asm("cvt.rni.s32.f32 %0, %1;" : "=r"(steps) : "f"(__fmul_rn(__uint_as_float(magnitude), 512.0f)));
    return sign | (unsigned)steps;
  }
  // Normal: keep 3 mantissa bits with round half to even on the f32 bits, then rebias the exponent 127 -> 7.
  const unsigned rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  return sign | (rounded - (120u << 3));
}

// e4m3: cvt.rn.satfinite (round half to even, clamp to +-448, NaN -> 0x7f) of two f32 products; low in the
// low byte.
__device__ __forceinline__ unsigned e4m3CodePair(float low, float high) {
#if __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(high), "f"(low));
  return pair;
#else
  return encodeE4m3Software(low) | encodeE4m3Software(high) << 8;
#endif
}

__device__ __forceinline__ unsigned e4m3Code(float scaled) { return e4m3CodePair(scaled, 0.0f) & 0xffu; }

// Four codes in one word, `a` in the low byte.
__device__ __forceinline__ unsigned e4m3Codes4(float a, float b, float c, float d) {
  return e4m3CodePair(a, b) | e4m3CodePair(c, d) << 16;
}

__device__ __forceinline__ uint2 packE4m3Codes(const float (&scaled)[8]) {
  return {e4m3CodePair(scaled[0], scaled[1]) | e4m3CodePair(scaled[2], scaled[3]) << 16,
          e4m3CodePair(scaled[4], scaled[5]) | e4m3CodePair(scaled[6], scaled[7]) << 16};
}

} // namespace sage::device::prologue
