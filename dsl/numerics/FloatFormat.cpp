#include "FloatFormat.h"

#include <bit>
#include <cmath>

namespace sage::numerics::detail {

uint64_t roundMagnitudeToCode(double magnitude, const FloatFormat &format) {
  // magnitude = significand * 2^(exponent - 52), with the hidden bit in significand for normal doubles.
  const uint64_t bits = std::bit_cast<uint64_t>(magnitude);
  const int biased_exponent = static_cast<int>(bits >> 52);
  const uint64_t fraction = bits & ((uint64_t{1} << 52) - 1);
  const uint64_t significand = biased_exponent == 0 ? fraction : fraction | (uint64_t{1} << 52);
  const int exponent = biased_exponent == 0 ? -1022 : biased_exponent - 1023;

  // The target's quantum (distance between neighbours) is 2^(e - mantissa_bits), where e is the
  // value's exponent, or the smallest normal exponent for subnormals.
  const int min_normal_exponent = 1 - format.exponent_bias;
  const int target_exponent = exponent > min_normal_exponent ? exponent : min_normal_exponent;
  // How many low significand bits fall below the quantum: always >= 52 - mantissa_bits > 0.
  const int shift = (target_exponent - format.mantissa_bits) - (exponent - 52);

  uint64_t quanta = 0; // magnitude / quantum, rounded half to even
  if (shift < 64) {
    quanta = significand >> shift;
    const uint64_t remainder = significand & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (remainder > half || (remainder == half && (quanta & 1) != 0))
      ++quanta;
  } // else significand < 2^53 <= half a quantum: rounds to zero.

  // A subnormal's code is `quanta` itself; a normal's quanta include the hidden bit 2^mantissa_bits,
  // which lands in the exponent field, so the sum below is the code. A round-up into the next binade
  // (quanta == 2^(mantissa_bits + 1)) carries into the exponent field the same way.
  return (static_cast<uint64_t>(target_exponent - min_normal_exponent) << format.mantissa_bits) + quanta;
}

double codeToMagnitude(uint32_t code, const FloatFormat &format) {
  const uint32_t exponent_field = code >> format.mantissa_bits;
  const uint32_t fraction = code & ((uint32_t{1} << format.mantissa_bits) - 1);
  if (exponent_field == 0)
    return std::ldexp(static_cast<double>(fraction), 1 - format.exponent_bias - format.mantissa_bits);
  const uint32_t significand = fraction | (uint32_t{1} << format.mantissa_bits);
  return std::ldexp(static_cast<double>(significand),
                    static_cast<int>(exponent_field) - format.exponent_bias - format.mantissa_bits);
}

} // namespace sage::numerics::detail
