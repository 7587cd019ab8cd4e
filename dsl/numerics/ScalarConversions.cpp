// Scalar conversions of Quantizers.h. Floating-point targets go through the one RNE encoder of
// FloatFormat.cpp; a float converts to double exactly, so the float and double paths round once.
#include "FloatFormat.h"
#include "sage/numerics/Quantizers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace sage::numerics {
namespace {

using detail::FloatFormat;

enum class Overflow { to_infinity, saturate };

// Sign bit plus the RNE magnitude code of a non-NaN value. On overflow, IEEE formats take the code
// after the largest finite one (their infinity); satfinite formats keep the largest finite code.
uint32_t encodeNonNan(double value, const FloatFormat &format, Overflow overflow, uint32_t sign_bit) {
  const uint32_t sign = std::signbit(value) ? sign_bit : 0;
  const double magnitude = std::fabs(value);
  const uint32_t overflow_code =
      overflow == Overflow::to_infinity ? format.max_finite_code + 1 : format.max_finite_code;
  if (std::isinf(magnitude))
    return sign | overflow_code;
  const uint64_t code = detail::roundMagnitudeToCode(magnitude, format);
  return sign | (code > format.max_finite_code ? overflow_code : static_cast<uint32_t>(code));
}

float signedValue(bool negative, double magnitude) {
  return static_cast<float>(negative ? -magnitude : magnitude); // exact: every code fits in float
}

float quietNan(bool negative) {
  return negative ? -std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::quiet_NaN();
}

// cvt.rni.sat on [-limit, limit]: NaN gives 0 as on the GPU; clamping first is exact because the
// bounds are integers.
int8_t roundHalfToEvenSaturated(float value, float limit) {
  if (std::isnan(value))
    return 0;
  const float clamped = std::clamp(value, -limit, limit);
  const float floor = std::floor(clamped);
  const float fraction = clamped - floor; // exact for |x| <= 127
  int result = static_cast<int>(floor);
  if (fraction > 0.5f || (fraction == 0.5f && (result & 1) != 0))
    ++result;
  return static_cast<int8_t>(result);
}

void requireCodeBelow(uint32_t bits, uint32_t limit, const char *function) {
  if (bits >= limit)
    throw std::invalid_argument(std::string(function) + ": bits must be below " + std::to_string(limit) + ", got " +
                                std::to_string(bits));
}

// The GPU's cvt.rn.f16.f32 / cvt.rn.bf16.f32 write one canonical NaN whatever the input payload.
constexpr uint16_t kCanonicalNan16 = 0x7fff;
constexpr uint8_t kFp8Nan = 0x7f;

} // namespace

// --- f16 / bf16 -------------------------------------------------------------------------------

uint16_t floatToHalfBits(float value) {
  if (std::isnan(value))
    return kCanonicalNan16;
  return static_cast<uint16_t>(encodeNonNan(value, detail::kHalf, Overflow::to_infinity, 0x8000));
}

float halfBitsToFloat(uint16_t bits) {
  const bool negative = (bits & 0x8000) != 0;
  const uint32_t magnitude = bits & 0x7fffu;
  if (magnitude > detail::kHalf.max_finite_code + 1)
    return quietNan(negative);
  if (magnitude == detail::kHalf.max_finite_code + 1)
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  return signedValue(negative, detail::codeToMagnitude(magnitude, detail::kHalf));
}

uint16_t floatToBfloat16Bits(float value) {
  if (std::isnan(value))
    return kCanonicalNan16;
  return static_cast<uint16_t>(encodeNonNan(value, detail::kBfloat16, Overflow::to_infinity, 0x8000));
}

float bfloat16BitsToFloat(uint16_t bits) {
  // bf16 is the upper half of a float: widening is a shift, NaN payloads included.
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

float roundToHalf(double value) {
  if (std::isnan(value))
    return halfBitsToFloat(kCanonicalNan16);
  return halfBitsToFloat(static_cast<uint16_t>(encodeNonNan(value, detail::kHalf, Overflow::to_infinity, 0x8000)));
}

float roundToBfloat16(double value) {
  if (std::isnan(value))
    return bfloat16BitsToFloat(kCanonicalNan16);
  return bfloat16BitsToFloat(
      static_cast<uint16_t>(encodeNonNan(value, detail::kBfloat16, Overflow::to_infinity, 0x8000)));
}

// --- FP8 --------------------------------------------------------------------------------------

uint8_t floatToE4m3Bits(float value) {
  if (std::isnan(value))
    return kFp8Nan; // the sign of a NaN is dropped, as cvt.rn.satfinite.e4m3x2.f32 does
  return static_cast<uint8_t>(encodeNonNan(value, detail::kE4m3, Overflow::saturate, 0x80));
}

float e4m3BitsToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80) != 0;
  const uint32_t magnitude = bits & 0x7fu;
  if (magnitude == 0x7f)
    return quietNan(negative);
  return signedValue(negative, detail::codeToMagnitude(magnitude, detail::kE4m3));
}

uint8_t floatToE5m2Bits(float value) {
  if (std::isnan(value))
    return kFp8Nan;
  return static_cast<uint8_t>(encodeNonNan(value, detail::kE5m2, Overflow::saturate, 0x80));
}

float e5m2BitsToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80) != 0;
  const uint32_t magnitude = bits & 0x7fu;
  if (magnitude > 0x7c) // exponent field all ones with a nonzero mantissa
    return quietNan(negative);
  if (magnitude == 0x7c)
    return negative ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  return signedValue(negative, detail::codeToMagnitude(magnitude, detail::kE5m2));
}

// --- FP4 and the NVFP4 scale ------------------------------------------------------------------

uint8_t floatToE2m1Bits(float value) {
  if (std::isnan(value))
    return static_cast<uint8_t>(detail::kE2m1.max_finite_code); // no NaN in E2M1: +6, as CUDA's cuda_fp4.h
  return static_cast<uint8_t>(encodeNonNan(value, detail::kE2m1, Overflow::saturate, 0x8));
}

float e2m1BitsToFloat(uint8_t bits) {
  requireCodeBelow(bits, 16, "e2m1BitsToFloat");
  return signedValue((bits & 0x8) != 0, detail::codeToMagnitude(bits & 0x7u, detail::kE2m1));
}

uint8_t floatToUe4m3Bits(float value) {
  // A scale cannot be negative: negative values, -0 and NaN clamp to +0 (code 0x00).
  if (std::isnan(value) || value <= 0.0f)
    return 0;
  return static_cast<uint8_t>(encodeNonNan(value, detail::kE4m3, Overflow::saturate, 0));
}

float ue4m3BitsToFloat(uint8_t bits) {
  requireCodeBelow(bits, 0x80, "ue4m3BitsToFloat");
  return e4m3BitsToFloat(bits);
}

float ue8m0BitsToFloat(uint8_t bits) {
  if (bits == 0xff)
    return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127); // 2^-127 is a float subnormal: exact
}

// --- integers ---------------------------------------------------------------------------------

int8_t roundToInt8(float value) { return roundHalfToEvenSaturated(value, 127.0f); }

int8_t roundToInt4(float value) { return roundHalfToEvenSaturated(value, 7.0f); }

} // namespace sage::numerics
