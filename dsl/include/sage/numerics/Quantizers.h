// Bit-exact scalar conversions and group quantizers, shared by the CPU reference and the tests.
//
// Every function here defines the exact f32 arithmetic that the generated kernels perform, so the
// reference and a kernel produce the same integer codes from the same f32 inputs:
//   int8/int4: scale = amax / qmax (f32, round-to-nearest), inverse = qmax / amax (f32),
//              code = cvt.rni.sat(x * inverse)  (f32 product, round half to even, saturate)
//   e4m3/e5m2: cvt.rn.satfinite (round half to even, clamp to the largest finite, NaN stays NaN)
//   e2m1:      round half to even onto {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating
// A group whose amax is 0 gets scale 0 and inverse 0: all codes are 0, nothing is NaN.
// NaN and edge choices (the f16/bf16/e4m3/e5m2/int8 ones match an H100's cvt on all 2^32 floats):
//   f16/bf16: any NaN -> 0x7fff; e4m3/e5m2: any NaN -> 0x7f (sign dropped); int8/int4: NaN -> 0;
//   e2m1: NaN -> +6 (0x7); ue4m3: negative, -0 and NaN -> 0x00; ue8m0 (MX scale): 0xff is NaN. Zero keeps its sign
//   where the format has one (e4m3(-0) = 0x80). Decoders reject bits outside the format (e2m1 >= 16, ue4m3 >= 0x80)
//   with std::invalid_argument.
#pragma once

#include <cstdint>
#include <span>

namespace sage::numerics {

// --- scalar conversions (round to nearest even) ---------------------------------------------
uint16_t floatToHalfBits(float value);
float halfBitsToFloat(uint16_t bits);
uint16_t floatToBfloat16Bits(float value);
float bfloat16BitsToFloat(uint16_t bits);
float roundToHalf(double value);     // double -> nearest f16, returned as float
float roundToBfloat16(double value); // double -> nearest bf16, returned as float

// cvt.rn.satfinite.e4m3x2.f32 on one value: E4M3 (bias 7, no infinities, max 448, NaN = 0x7f).
uint8_t floatToE4m3Bits(float value);
float e4m3BitsToFloat(uint8_t bits);
// cvt.rn.satfinite.e5m2x2.f32 on one value: E5M2 (bias 15, max finite 57344, NaN = 0x7f).
uint8_t floatToE5m2Bits(float value);
float e5m2BitsToFloat(uint8_t bits);
// E2M1 (FP4): sign bit + 3 bits, values {0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating.
uint8_t floatToE2m1Bits(float value);
float e2m1BitsToFloat(uint8_t bits);
// UE4M3: an unsigned E4M3 scale (NVFP4's microscale), round to nearest even, saturating at 448.
uint8_t floatToUe4m3Bits(float value);
float ue4m3BitsToFloat(uint8_t bits);
// UE8M0: the OCP MX scale, a bare biased exponent: bits b mean 2^(b - 127); 0xff is NaN.
float ue8m0BitsToFloat(uint8_t bits);

// cvt.rni.sat.s8.f32 / an int4 equivalent: round half to even, saturate to [-qmax, qmax].
int8_t roundToInt8(float value);
// INT4 is symmetric, [-7, 7], not [-8, 7]: the scale is amax / 7 for both signs, so -x gets exactly the code
// -code(x) and a group's largest magnitude maps to +-7 whichever its sign (SageAttention2's int4 does the same);
// -8 would be reachable only by negative values and never by the amax of the group.
int8_t roundToInt4(float value); // saturates to [-7, 7]

// --- group quantizers ----------------------------------------------------------------------
struct SymmetricScale {
  float scale = 0.0f;   // dequantize: x ~= code * scale
  float inverse = 0.0f; // quantize:   code = round(x * inverse)
};

// amax / qmax and qmax / amax in f32, 0/0 for an all-zero group. Throws std::invalid_argument unless
// amax >= 0 (inf allowed: scale inf, inverse 0) and qmax is finite and positive.
SymmetricScale symmetricScale(float amax, float qmax);

// Group quantizers: amax = max |x| in f32 (a NaN never wins, like max.f32), then symmetricScale, then
// code = convert(x * inverse). `codes` must be as long as `values` (else std::invalid_argument).
// Quantizes `values` with one symmetric scale to int8 ([-127, 127]); returns the scale.
float quantizeInt8(std::span<const float> values, std::span<int8_t> codes);
// Same with qmax 7 for int4 codes stored one per byte.
float quantizeInt4(std::span<const float> values, std::span<int8_t> codes);
// FP8 with a scale: scale = amax / max_finite (448 for e4m3, 57344 for e5m2); codes are bit patterns.
float quantizeE4m3(std::span<const float> values, std::span<uint8_t> codes);
float quantizeE5m2(std::span<const float> values, std::span<uint8_t> codes);

// NVFP4 microscaling of one row: groups of 16 values share a UE4M3 scale (amax / 6 rounded to
// UE4M3, after dividing by `global_scale`); codes are E2M1 bit patterns, one per byte.
// Dequantize: x ~= e2m1(code) * ue4m3(scale) * global_scale.
// Exact f32 steps per group: v = x / global_scale; scale_code = ue4m3(max|v| / 6); s = ue4m3 value;
// inverse = s > 0 ? 1 / s : 0; code = e2m1(v * inverse). The last group may hold fewer than 16 values;
// scale_codes holds ceil(n / 16) entries. global_scale must be finite and positive.
void quantizeNvfp4Row(std::span<const float> values, float global_scale, std::span<uint8_t> codes,
                      std::span<uint8_t> scale_codes);

// The scale codes of one microscaled group from its f32 amax (>= 0, as absoluteMax gives it):
//   NVFP4: ue4m3(amax / 6) (round to nearest even, saturating at 448; 0 for an all-zero group).
//   MXFP4: OCP MX v1.0: 2^(floor(log2 amax) - 2), 2 being E2M1's largest exponent, as a UE8M0 code clamped to
//          [0, 254]; an all-zero group gets code 0 (2^-127). The largest value may land in [6, 8) and saturate to
//          6: the spec's choice, part of why MXFP4 is less accurate than NVFP4.
uint8_t nvfp4ScaleBits(float amax);
uint8_t mxfp4ScaleBits(float amax);

// MXFP4 microscaling of one row: groups of 32 values share a UE8M0 scale (mxfp4ScaleBits of their amax); codes
// are E2M1 bit patterns, one per byte: code = e2m1(x * 2^-(exponent)), where the power-of-two product is exact.
// Dequantize: x ~= e2m1(code) * ue8m0(scale). scale_codes holds ceil(n / 32) entries.
void quantizeMxfp4Row(std::span<const float> values, std::span<uint8_t> codes, std::span<uint8_t> scale_codes);

} // namespace sage::numerics
