// NVFP4 and MXFP4 microscaling on one value or one 8-value vector: E2M1 codes, UE4M3 and UE8M0 scales, and their
// decoded values. The f32 steps are those of sage/numerics/Quantizers.h (quantizeNvfp4Row, quantizeMxfp4Row), bit
// for bit; the header also compiles as host C++ (tests/codegen/Fp4MicroscalingTest.cpp checks it against
// sage::numerics on the CPU), so the prologue's arithmetic is tested without a GPU.
#pragma once

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define SAGE_FP4_FUNCTION __host__ __device__ __forceinline__
#else
#define SAGE_FP4_FUNCTION inline
#endif

namespace sage::device::fp4 {

SAGE_FP4_FUNCTION unsigned float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  return __builtin_bit_cast(unsigned, value);
#endif
}

SAGE_FP4_FUNCTION float bits_float(unsigned bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  return __builtin_bit_cast(float, bits);
#endif
}

// One f32 rounding each (no FMA contraction on the device).
SAGE_FP4_FUNCTION float multiply_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

SAGE_FP4_FUNCTION float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// max |x| as max.f32 takes it: a NaN never wins.
SAGE_FP4_FUNCTION float max_magnitude(float amax, float value) {
  const float magnitude = bits_float(float_bits(value) & 0x7fffffffu);
  return magnitude > amax ? magnitude : amax;
}

// E2M1 (sign bit 3, magnitude code in bits 0-2): round half to even onto {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating at
// 6; a NaN becomes +6 (0x7); zero keeps its sign.
SAGE_FP4_FUNCTION unsigned e2m1_code(float value) {
  const unsigned bits = float_bits(value);
  const unsigned magnitude_bits = bits & 0x7fffffffu;
  if (magnitude_bits > 0x7f800000u)
    return 0x7u;
  const float a = bits_float(magnitude_bits);
  // Midpoints between neighbours; a tie goes to the even code (the one whose last bit is 0).
  const unsigned code = a <= 0.25f   ? 0u
                        : a < 0.75f  ? 1u
                        : a <= 1.25f ? 2u
                        : a < 1.75f  ? 3u
                        : a <= 2.5f  ? 4u
                        : a < 3.5f   ? 5u
                        : a <= 5.0f  ? 6u
                                     : 7u;
  return (bits >> 28 & 0x8u) | code;
}

// The value of an E2M1 code (bits 0-3).
SAGE_FP4_FUNCTION float e2m1_value(unsigned code) {
  const unsigned exponent = code >> 1 & 0x3u, half = code & 0x1u;
  const float magnitude = exponent == 0 ? 0.5f * static_cast<float>(half)
                                        : bits_float((exponent + 126u) << 23 | half << 22); // (1 + half/2) 2^(e-1)
  return (code & 0x8u) != 0 ? -magnitude : magnitude;
}

// UE4M3 (an unsigned E4M3 scale, bias 7): round half to even, saturating at 448 (0x7e); NaN, zero and negative
// values give 0.
SAGE_FP4_FUNCTION unsigned ue4m3_code(float value) {
  if (!(value > 0.0f))
    return 0u;
  if (value >= 448.0f)
    return 0x7eu;
  if (value < 0.015625f) { // below 2^-6: subnormal steps of 2^-9; 8 steps is the smallest normal, code 0x08
    const float steps = multiply_rn(value, 512.0f); // exact: a power-of-two scaling
#if defined(__CUDA_ARCH__)
    return static_cast<unsigned>(__float2int_rn(steps));
#else
    return static_cast<unsigned>(__builtin_rintf(steps)); // the default rounding mode: to nearest even
#endif
  }
  // Normal: keep 3 mantissa bits, round half to even on the f32 bits (a carry moves into the exponent), rebias the
  // exponent 127 -> 7.
  const unsigned bits = float_bits(value);
  return ((bits + 0x7ffffu + (bits >> 20 & 1u)) >> 20) - (120u << 3);
}

SAGE_FP4_FUNCTION float ue4m3_value(unsigned code) {
  const unsigned exponent = code >> 3 & 0xfu, mantissa = code & 0x7u;
  if (exponent == 0)
    return multiply_rn(static_cast<float>(mantissa), 0.001953125f); // m 2^-9
  return bits_float((exponent + 120u) << 23 | mantissa << 20);
}

// NVFP4's microscale of a group with this amax: ue4m3(amax / 6).
SAGE_FP4_FUNCTION unsigned nvfp4_scale_code(float amax) { return ue4m3_code(divide_rn(amax, 6.0f)); }

// What the codes are computed with: 1 / scale in f32, 0 for a zero scale.
SAGE_FP4_FUNCTION float nvfp4_inverse(unsigned scale_code) {
  const float scale = ue4m3_value(scale_code);
  return scale > 0.0f ? divide_rn(1.0f, scale) : 0.0f;
}

// MXFP4's microscale (OCP MX v1.0): 2^(floor(log2 amax) - 2) as a UE8M0 code clamped to [0, 254]; 0 for an
// all-zero (or NaN) group, 254 for an infinite amax.
SAGE_FP4_FUNCTION unsigned mxfp4_scale_code(float amax) {
  if (!(amax > 0.0f))
    return 0u;
  const int biased_exponent = static_cast<int>(float_bits(amax) >> 23 & 0xffu); // 0 for a subnormal amax
  if (biased_exponent == 0xff)
    return 254u;
  const int code = biased_exponent - 2; // floor(log2 amax) - 2 + 127; a subnormal amax clamps to 0 as well
  return static_cast<unsigned>(code < 0 ? 0 : code);
}

// 2^(127 - code): exact, a subnormal f32 for code 254.
SAGE_FP4_FUNCTION float mxfp4_inverse(unsigned scale_code) {
  return scale_code >= 254u ? bits_float(0x00400000u) : bits_float((254u - scale_code) << 23);
}

SAGE_FP4_FUNCTION float ue8m0_value(unsigned code) {
  return code == 0u ? bits_float(0x00400000u) : bits_float(code << 23); // 2^(code - 127); 0xff is not produced
}

// Eight E2M1 codes of x * inverse (f32 products) in one word: element 2k in the low nibble of byte k.
SAGE_FP4_FUNCTION unsigned pack_e2m1x8(const float (&x)[8], float inverse) {
  unsigned packed = 0u;
  for (int j = 0; j < 8; ++j) // unrolled by nvcc (a constant trip count); no pragma, which host compilers warn about
    packed |= e2m1_code(multiply_rn(x[j], inverse)) << (4 * j);
  return packed;
}

// ---- Either format by its group size (16: NVFP4, UE4M3 scales; 32: MXFP4, UE8M0 scales) ----

SAGE_FP4_FUNCTION unsigned microscale_code(float amax, int group) {
  return group == 32 ? mxfp4_scale_code(amax) : nvfp4_scale_code(amax);
}

SAGE_FP4_FUNCTION float microscale_value(unsigned scale_code, int group) {
  return group == 32 ? ue8m0_value(scale_code) : ue4m3_value(scale_code);
}

SAGE_FP4_FUNCTION float microscale_inverse(unsigned scale_code, int group) {
  return group == 32 ? mxfp4_inverse(scale_code) : nvfp4_inverse(scale_code);
}

// ---- Decoding: the FP4 emulation's sage.decode (code value x microscale, exact in f32 and in the 16-bit type the
// legalization picks: f16 for NVFP4, bf16 for MXFP4) ----

// Eight E2M1 codes of one word (element j in bits 4j .. 4j + 3) times their group's scale.
SAGE_FP4_FUNCTION void decode_e2m1x8(unsigned packed, float scale, float (&values)[8]) {
  for (int j = 0; j < 8; ++j)
    values[j] = multiply_rn(e2m1_value(packed >> (4 * j) & 0xfu), scale);
}

// ---- P~ (the attention kernel's side, SageAttention3's Algorithm 1 line 10; reference::quantizeProbabilities) ----

// Two-level P: the per-row f32 scale s_P1 = rowmax(P~) / (448 * 6) and its inverse, as numerics::symmetricScale
// computes them (0 and 0 for an all-zero row).
struct RowScale {
  float scale, inverse;
};

SAGE_FP4_FUNCTION RowScale probability_row_scale(float row_max) {
  if (row_max == 0.0f)
    return {0.0f, 0.0f};
  return {divide_rn(row_max, 2688.0f), divide_rn(2688.0f, row_max)};
}

// One 1x16 group of P~ (times the row's inverse for two-level P, or as it is for direct P: `x` holds those f32
// products): its ue4m3 scale from the group's amax, then each value replaced by its dequantized E2M1 code
// (code value x scale, exact in f32 and in f16). The row scale s_P1 is applied afterwards (per row, in f32).
SAGE_FP4_FUNCTION float quantize_probability(float x, float scale, float inverse) {
  return multiply_rn(e2m1_value(e2m1_code(multiply_rn(x, inverse))), scale);
}

} // namespace sage::device::fp4
