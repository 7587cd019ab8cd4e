// Internal to sage_numerics: one round-to-nearest-even encoder and one decoder for every small binary
// floating-point format (f16, bf16, e4m3, e5m2, e2m1), so each format differs only in its parameters.
#pragma once

#include <cstdint>

namespace sage::numerics::detail {

// A binary format without its sign bit: `mantissa_bits` stored fraction bits, an exponent field with
// `exponent_bias`, and subnormals below the smallest normal (exponent field 0).
struct FloatFormat {
  int mantissa_bits;
  int exponent_bias;
  uint32_t max_finite_code; // the magnitude code (sign bit excluded) of the largest finite value
};

inline constexpr FloatFormat kHalf{10, 15, 0x7bff};     // 65504
inline constexpr FloatFormat kBfloat16{7, 127, 0x7f7f}; // 3.3895314e38
inline constexpr FloatFormat kE4m3{3, 7, 0x7e};         // 448 (0x7f is NaN)
inline constexpr FloatFormat kE5m2{2, 15, 0x7b};        // 57344
inline constexpr FloatFormat kE2m1{1, 1, 0x7};          // 6

// The magnitude code nearest to `magnitude` (finite, >= 0), ties to the even code, computed as if the
// exponent were unbounded above: a result above `max_finite_code` means overflow, and the caller
// chooses infinity or saturation. Exact: the value is rounded once, directly from double.
uint64_t roundMagnitudeToCode(double magnitude, const FloatFormat &format);

// The value of a finite magnitude code (no sign bit, code <= max_finite_code), exactly.
double codeToMagnitude(uint32_t code, const FloatFormat &format);

} // namespace sage::numerics::detail
