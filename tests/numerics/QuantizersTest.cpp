// Scalar conversions of sage/numerics/Quantizers.h. Every expected value is derived by hand in the
// comment beside it (value = 2^(E - bias) * (1 + M / 2^m) for normals, M * 2^(1 - bias - m) for
// subnormals); the exhaustive and property tests check round trips, ordering and nearest-even choice.
#include "sage/numerics/Quantizers.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

using namespace sage::numerics;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

uint32_t bitsOf(float value) { return std::bit_cast<uint32_t>(value); }

// The next float above / below `value` (one unit in the last place).
float floatAbove(float value) { return std::nextafter(value, kInf); }
float floatBelow(float value) { return std::nextafter(value, -kInf); }

// Positive floats from 0 to +inf in increasing order, every `stride`-th bit pattern plus the last one.
template <typename Visit> void sweepPositiveFloats(uint32_t stride, Visit visit) {
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += stride)
    visit(std::bit_cast<float>(bits));
  visit(kInf);
}

} // namespace

// --- f16 --------------------------------------------------------------------------------------

TEST_CASE("f16: normal values, ties to even, overflow") {
  CHECK(floatToHalfBits(1.0f) == 0x3c00);     // E = 15 (2^0), M = 0
  CHECK(floatToHalfBits(-2.0f) == 0xc000);    // sign, E = 16, M = 0
  CHECK(floatToHalfBits(0.1f) == 0x2e66);     // 0.1 = 1.6 * 2^-4: E = 11, M = 0.6 * 1024 = 614.4 -> 614 = 0x266
  CHECK(floatToHalfBits(65504.0f) == 0x7bff); // largest finite: (2 - 2^-10) * 2^15
  // 1 + 2^-11 is halfway between 1 (M = 0, even) and 1 + 2^-10 (M = 1): even wins.
  CHECK(floatToHalfBits(1.0f + 0x1p-11f) == 0x3c00);
  CHECK(floatToHalfBits(floatAbove(1.0f + 0x1p-11f)) == 0x3c01); // just above the tie rounds up
  // 1 + 3 * 2^-11 is halfway between M = 1 (odd) and M = 2 (even).
  CHECK(floatToHalfBits(1.0f + 3 * 0x1p-11f) == 0x3c02);
  CHECK(floatToHalfBits(-1.0f - 3 * 0x1p-11f) == 0xbc02);
  // 65520 is halfway between 65504 (M = 0x3ff, odd) and 2^16 (even, beyond the range): overflow.
  CHECK(floatToHalfBits(65520.0f) == 0x7c00);
  CHECK(floatToHalfBits(floatBelow(65520.0f)) == 0x7bff);
  CHECK(floatToHalfBits(-1.0e6f) == 0xfc00);
  CHECK(floatToHalfBits(kInf) == 0x7c00);
  CHECK(floatToHalfBits(-kInf) == 0xfc00);
}

TEST_CASE("f16: subnormals and signed zero") {
  CHECK(floatToHalfBits(0x1p-24f) == 0x0001);  // smallest subnormal: 1 * 2^-24
  CHECK(floatToHalfBits(-0x1p-24f) == 0x8001); // its negative
  CHECK(floatToHalfBits(0x1p-25f) == 0x0000);  // halfway between 0 (even) and 2^-24
  CHECK(floatToHalfBits(floatAbove(0x1p-25f)) == 0x0001);
  CHECK(floatToHalfBits(3 * 0x1p-25f) == 0x0002);       // 1.5 quanta: tie, 2 is even
  CHECK(floatToHalfBits(1023 * 0x1p-24f) == 0x03ff);    // largest subnormal
  CHECK(floatToHalfBits(1023.5f * 0x1p-24f) == 0x0400); // tie between 0x3ff (odd) and 2^-14 (the smallest normal)
  CHECK(floatToHalfBits(0x1p-14f) == 0x0400);           // smallest normal: E = 1
  CHECK(floatToHalfBits(-0x1p-26f) == 0x8000);          // underflows to -0, keeping the sign
  CHECK(floatToHalfBits(0.0f) == 0x0000);
  CHECK(floatToHalfBits(-0.0f) == 0x8000);
}

TEST_CASE("f16: NaN becomes the canonical NaN 0x7fff") {
  // The GPU's cvt.rn.f16.f32 writes 0x7fff for every NaN (checked on an H100 over all NaN inputs).
  CHECK(floatToHalfBits(kNan) == 0x7fff);
  CHECK(floatToHalfBits(-kNan) == 0x7fff);
  CHECK(std::isnan(roundToHalf(std::numeric_limits<double>::quiet_NaN())));
}

TEST_CASE("f16: decoding") {
  CHECK(halfBitsToFloat(0x3c00) == 1.0f);
  CHECK(halfBitsToFloat(0x3555) == 0.333251953125f); // E = 13, M = 341: 2^-2 * 1365 / 1024
  CHECK(halfBitsToFloat(0x0001) == 0x1p-24f);
  CHECK(halfBitsToFloat(0x7bff) == 65504.0f);
  CHECK(halfBitsToFloat(0xfbff) == -65504.0f);
  CHECK(halfBitsToFloat(0x7c00) == kInf);
  CHECK(halfBitsToFloat(0xfc00) == -kInf);
  CHECK(std::isnan(halfBitsToFloat(0x7e00)));
  CHECK(std::isnan(halfBitsToFloat(0xfc01)));
  CHECK(bitsOf(halfBitsToFloat(0x8000)) == 0x80000000u); // -0
}

TEST_CASE("f16: every one of the 65536 codes survives decode then encode") {
  int nan_codes = 0;
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    const float value = halfBitsToFloat(static_cast<uint16_t>(code));
    if ((code & 0x7c00) == 0x7c00 && (code & 0x03ff) != 0) { // exponent all ones, mantissa nonzero: NaN
      ++nan_codes;
      CHECK(std::isnan(value));
      CHECK(floatToHalfBits(value) == 0x7fff);
      continue;
    }
    CAPTURE(code);
    REQUIRE(floatToHalfBits(value) == code);
    REQUIRE(bitsOf(roundToHalf(static_cast<double>(value))) == bitsOf(value));
  }
  CHECK(nan_codes == 2 * 1023);
}

TEST_CASE("f16: decoding is strictly increasing and encoding is monotonic") {
  for (uint16_t code = 0; code < 0x7c00; ++code) // 0 .. +inf in code order
    REQUIRE(halfBitsToFloat(code) < halfBitsToFloat(static_cast<uint16_t>(code + 1)));
  float previous = 0.0f;
  sweepPositiveFloats(997, [&](float x) {
    const float rounded = halfBitsToFloat(floatToHalfBits(x));
    REQUIRE(rounded >= previous);
    previous = rounded;
  });
}

TEST_CASE("f16 from double rounds once, directly from the double") {
  // 1 + 2^-11 + 2^-40: above the f16 tie, so f16 gives 1 + 2^-10. Through float it would first become
  // 1 + 2^-11 (2^-40 is below half a float ulp), an exact tie, then 1.0: the double rounding error.
  CHECK(roundToHalf(1.0 + 0x1p-11 + 0x1p-40) == 1.0f + 0x1p-10f);
  CHECK(roundToHalf(1.0 + 0x1p-11) == 1.0f);   // an exact tie goes to even
  CHECK(roundToHalf(0.1) == 0.0999755859375f); // 0x2e66: 2^-4 * (1 + 614 / 1024)
  CHECK(roundToHalf(65519.999) == 65504.0f);   // below the 65520 tie
  CHECK(roundToHalf(65520.0) == kInf);         // the tie rounds to 2^16: overflow
  CHECK(roundToHalf(-1e300) == -kInf);
  CHECK(roundToHalf(0x1p-25 + 0x1p-60) == 0x1p-24f);  // just above half the smallest subnormal
  CHECK(roundToHalf(0x1p-25) == 0.0f);                // exactly half: 0 is even
  CHECK(bitsOf(roundToHalf(-1e-300)) == 0x80000000u); // underflow keeps the sign
}

// --- bf16 -------------------------------------------------------------------------------------

TEST_CASE("bf16: rounding, ties, overflow, subnormals") {
  CHECK(floatToBfloat16Bits(1.0f) == 0x3f80);
  CHECK(floatToBfloat16Bits(3.14159265f) == 0x4049);                // pi / 2 = 1.5708: M = 0.5708 * 128 = 73.06 -> 73
  CHECK(floatToBfloat16Bits(1.0f + 0x1p-8f) == 0x3f80);             // tie between M = 0 and M = 1: even
  CHECK(floatToBfloat16Bits(floatAbove(1.0f + 0x1p-8f)) == 0x3f81); // just above the tie
  CHECK(floatToBfloat16Bits(1.0f + 3 * 0x1p-8f) == 0x3f82);         // tie between M = 1 and M = 2
  CHECK(floatToBfloat16Bits(-1.0f - 3 * 0x1p-8f) == 0xbf82);
  // Largest finite bf16 is (2 - 2^-7) * 2^127 (0x7f7f); (2 - 2^-8) * 2^127 is the tie with 2^128.
  CHECK(floatToBfloat16Bits(floatBelow(0x1.ffp127f)) == 0x7f7f);
  CHECK(floatToBfloat16Bits(0x1.ffp127f) == 0x7f80); // tie: M = 127 is odd, so it rounds up to infinity
  CHECK(floatToBfloat16Bits(std::numeric_limits<float>::max()) == 0x7f80);
  CHECK(floatToBfloat16Bits(-kInf) == 0xff80);
  // Subnormal quantum is 2^-133 (2^-126 / 2^7).
  CHECK(floatToBfloat16Bits(0x1p-133f) == 0x0001);
  CHECK(floatToBfloat16Bits(0x1p-134f) == 0x0000);     // tie with 0: even
  CHECK(floatToBfloat16Bits(3 * 0x1p-134f) == 0x0002); // tie between 1 and 2 quanta: even
  CHECK(floatToBfloat16Bits(0x1p-149f) == 0x0000);     // the smallest float subnormal
  CHECK(floatToBfloat16Bits(-0x1p-149f) == 0x8000);
  CHECK(floatToBfloat16Bits(kNan) == 0x7fff); // canonical NaN, as cvt.rn.bf16.f32 (checked on an H100)
  CHECK(floatToBfloat16Bits(-kNan) == 0x7fff);
}

TEST_CASE("bf16: decoding and the exhaustive round trip") {
  CHECK(bfloat16BitsToFloat(0x4049) == 3.140625f); // 2 * (1 + 73 / 128)
  CHECK(bfloat16BitsToFloat(0xff80) == -kInf);
  CHECK(bfloat16BitsToFloat(0x0001) == 0x1p-133f);
  CHECK(std::isnan(bfloat16BitsToFloat(0x7fc0)));
  for (uint32_t code = 0; code <= 0xffff; ++code) {
    const bool is_nan = (code & 0x7f80) == 0x7f80 && (code & 0x007f) != 0;
    const float value = bfloat16BitsToFloat(static_cast<uint16_t>(code));
    CAPTURE(code);
    REQUIRE(floatToBfloat16Bits(value) == (is_nan ? 0x7fff : code));
  }
}

TEST_CASE("bf16 from double rounds once") {
  // 1 + 2^-8 + 2^-40 is above the bf16 tie (1 + 2^-7); through float it would be the exact tie -> 1.0.
  CHECK(roundToBfloat16(1.0 + 0x1p-8 + 0x1p-40) == 1.0f + 0x1p-7f);
  CHECK(roundToBfloat16(1.0 + 0x1p-8) == 1.0f);
  CHECK(roundToBfloat16(1e39) == kInf); // beyond float's range too: no float intermediate overflows first
  CHECK(roundToBfloat16(0x1p-133) == 0x1p-133f);
}

// --- E4M3 -------------------------------------------------------------------------------------

TEST_CASE("e4m3: hand-computed codes") {
  CHECK(floatToE4m3Bits(1.0f) == 0x38);   // E = 7, M = 0
  CHECK(floatToE4m3Bits(-1.0f) == 0xb8);  // sign bit
  CHECK(floatToE4m3Bits(0.1f) == 0x1d);   // 1.6 * 2^-4: E = 3, M = 0.6 * 8 = 4.8 -> 5 (0.1015625)
  CHECK(floatToE4m3Bits(300.0f) == 0x79); // 1.171875 * 2^8: E = 15, M = 1.375 -> 1 (288; the tie is 304)
  CHECK(floatToE4m3Bits(-300.0f) == 0xf9);
  CHECK(floatToE4m3Bits(448.0f) == 0x7e);  // 1.75 * 2^8: E = 15, M = 6, the largest finite
  CHECK(floatToE4m3Bits(240.0f) == 0x77);  // 1.875 * 2^7: E = 14, M = 7
  CHECK(floatToE4m3Bits(248.0f) == 0x78);  // tie between 240 (M = 7, odd) and 256 (E = 15, M = 0)
  CHECK(floatToE4m3Bits(17.0f) == 0x58);   // 1.0625 * 16: tie between M = 0 and M = 1 -> 16 (E = 11)
  CHECK(floatToE4m3Bits(1.0625f) == 0x38); // tie between 1 (M = 0) and 1.125 (M = 1): even
  CHECK(floatToE4m3Bits(1.1875f) == 0x3a); // tie between 1.125 (M = 1) and 1.25 (M = 2): even
  CHECK(floatToE4m3Bits(-1.1875f) == 0xba);
}

TEST_CASE("e4m3: satfinite at 448") {
  CHECK(floatToE4m3Bits(449.0f) == 0x7e); // nearer 448 than 480
  CHECK(floatToE4m3Bits(464.0f) == 0x7e); // the 448/480 tie: M = 6 is even
  CHECK(floatToE4m3Bits(480.0f) == 0x7e); // would be E = 15, M = 7, which is NaN: saturates
  CHECK(floatToE4m3Bits(1.0e9f) == 0x7e);
  CHECK(floatToE4m3Bits(kInf) == 0x7e); // satfinite: infinity saturates too
  CHECK(floatToE4m3Bits(-449.0f) == 0xfe);
  CHECK(floatToE4m3Bits(-kInf) == 0xfe);
}

TEST_CASE("e4m3: subnormals (quantum 2^-9) and zeros") {
  CHECK(floatToE4m3Bits(1e-3f) == 0x01);    // 1e-3 / 2^-9 = 0.512 -> 1
  CHECK(floatToE4m3Bits(0x1p-9f) == 0x01);  // the smallest subnormal
  CHECK(floatToE4m3Bits(0x1p-10f) == 0x00); // half the smallest subnormal: tie, 0 is even
  CHECK(floatToE4m3Bits(floatAbove(0x1p-10f)) == 0x01);
  CHECK(floatToE4m3Bits(-0x1p-10f) == 0x80);      // rounds to -0
  CHECK(floatToE4m3Bits(3 * 0x1p-10f) == 0x02);   // 1.5 quanta: even
  CHECK(floatToE4m3Bits(7.5f * 0x1p-9f) == 0x08); // tie between 7 quanta (odd) and 2^-6, the smallest normal
  CHECK(floatToE4m3Bits(0x1p-6f) == 0x08);        // smallest normal: E = 1, M = 0
  CHECK(floatToE4m3Bits(0.0f) == 0x00);
  CHECK(floatToE4m3Bits(-0.0f) == 0x80);
}

TEST_CASE("e4m3: NaN becomes 0x7f whatever its sign") {
  // cvt.rn.satfinite.e4m3x2.f32 drops the sign of a NaN (checked on an H100 over all NaN inputs).
  CHECK(floatToE4m3Bits(kNan) == 0x7f);
  CHECK(floatToE4m3Bits(-kNan) == 0x7f);
}

TEST_CASE("e4m3: decoding") {
  CHECK(e4m3BitsToFloat(0x7e) == 448.0f);
  CHECK(e4m3BitsToFloat(0xfe) == -448.0f);
  CHECK(e4m3BitsToFloat(0x01) == 0x1p-9f);
  CHECK(e4m3BitsToFloat(0x08) == 0x1p-6f);
  CHECK(e4m3BitsToFloat(0x3c) == 1.5f); // E = 7, M = 4
  CHECK(e4m3BitsToFloat(0x1d) == 0.1015625f);
  CHECK(bitsOf(e4m3BitsToFloat(0x80)) == 0x80000000u);
  CHECK(std::isnan(e4m3BitsToFloat(0x7f)));
  CHECK(std::isnan(e4m3BitsToFloat(0xff)));
}

// --- E5M2 -------------------------------------------------------------------------------------

TEST_CASE("e5m2: hand-computed codes, satfinite, subnormals, NaN") {
  CHECK(floatToE5m2Bits(1.0f) == 0x3c);   // E = 15, M = 0
  CHECK(floatToE5m2Bits(0.1f) == 0x2e);   // 1.6 * 2^-4: E = 11, M = 0.6 * 4 = 2.4 -> 2 (0.09375)
  CHECK(floatToE5m2Bits(448.0f) == 0x5f); // 1.75 * 2^8: E = 23, M = 3
  CHECK(floatToE5m2Bits(-1.0f) == 0xbc);
  CHECK(floatToE5m2Bits(1.125f) == 0x3c);   // tie between 1 (M = 0) and 1.25 (M = 1): even
  CHECK(floatToE5m2Bits(1.375f) == 0x3e);   // tie between 1.25 (M = 1) and 1.5 (M = 2): even
  CHECK(floatToE5m2Bits(57344.0f) == 0x7b); // 1.75 * 2^15: E = 30, M = 3, the largest finite
  CHECK(floatToE5m2Bits(61440.0f) == 0x7b); // the 57344/65536 tie would overflow: satfinite
  CHECK(floatToE5m2Bits(1.0e9f) == 0x7b);
  CHECK(floatToE5m2Bits(kInf) == 0x7b);
  CHECK(floatToE5m2Bits(-kInf) == 0xfb);
  CHECK(floatToE5m2Bits(0x1p-16f) == 0x01);     // smallest subnormal: quantum 2^-14 / 4
  CHECK(floatToE5m2Bits(0x1p-17f) == 0x00);     // tie with 0
  CHECK(floatToE5m2Bits(3 * 0x1p-17f) == 0x02); // tie between 1 and 2 quanta
  CHECK(floatToE5m2Bits(-0x1p-17f) == 0x80);
  CHECK(floatToE5m2Bits(kNan) == 0x7f);
  CHECK(floatToE5m2Bits(-kNan) == 0x7f);
}

TEST_CASE("e5m2: decoding") {
  CHECK(e5m2BitsToFloat(0x7b) == 57344.0f);
  CHECK(e5m2BitsToFloat(0x01) == 0x1p-16f);
  CHECK(e5m2BitsToFloat(0x2e) == 0.09375f);
  CHECK(e5m2BitsToFloat(0x7c) == kInf);
  CHECK(e5m2BitsToFloat(0xfc) == -kInf);
  CHECK(std::isnan(e5m2BitsToFloat(0x7d)));
  CHECK(std::isnan(e5m2BitsToFloat(0x7e)));
  CHECK(std::isnan(e5m2BitsToFloat(0xff)));
}

// --- FP8 exhaustive and property tests -----------------------------------------------------------

TEST_CASE("fp8: all 256 codes survive decode then encode") {
  for (uint32_t code = 0; code < 256; ++code) {
    CAPTURE(code);
    const uint8_t bits = static_cast<uint8_t>(code);
    const uint32_t magnitude = code & 0x7f;
    if (magnitude == 0x7f)
      CHECK(floatToE4m3Bits(e4m3BitsToFloat(bits)) == 0x7f); // NaN
    else
      CHECK(floatToE4m3Bits(e4m3BitsToFloat(bits)) == code);

    if (magnitude > 0x7c)
      CHECK(floatToE5m2Bits(e5m2BitsToFloat(bits)) == 0x7f); // NaN
    else if (magnitude == 0x7c)
      CHECK(floatToE5m2Bits(e5m2BitsToFloat(bits)) == (code & 0x80) + 0x7b); // satfinite: inf -> max
    else
      CHECK(floatToE5m2Bits(e5m2BitsToFloat(bits)) == code);
  }
}

TEST_CASE("fp8: decoding is strictly increasing in code order") {
  for (uint8_t code = 0; code < 0x7e; ++code)
    REQUIRE(e4m3BitsToFloat(code) < e4m3BitsToFloat(static_cast<uint8_t>(code + 1)));
  for (uint8_t code = 0; code < 0x7c; ++code)
    REQUIRE(e5m2BitsToFloat(code) < e5m2BitsToFloat(static_cast<uint8_t>(code + 1)));
}

// For positive x within range, the chosen code must be nearest, with a tie going to the even code; the
// neighbours' values come from the decoder (itself checked by hand above).
template <typename Encode, typename Decode>
void checkNearestEven(float x, uint8_t max_code, Encode encode, Decode decode) {
  // Distances in double, so two different float distances never round to a false tie.
  const auto distance = [&](uint8_t code) { return std::fabs(static_cast<double>(decode(code)) - x); };
  const uint8_t code = encode(x);
  const double error = distance(code);
  CAPTURE(x);
  CAPTURE(static_cast<int>(code));
  if (code > 0) {
    const double below = distance(static_cast<uint8_t>(code - 1));
    REQUIRE((error < below || (error == below && code % 2 == 0)));
  }
  if (code < max_code) {
    const double above = distance(static_cast<uint8_t>(code + 1));
    REQUIRE((error < above || (error == above && code % 2 == 0)));
  }
}

TEST_CASE("fp8: every encoded value is the nearest, ties to even, and encoding is monotonic") {
  uint8_t previous_e4m3 = 0, previous_e5m2 = 0;
  sweepPositiveFloats(613, [&](float x) {
    if (x <= 448.0f)
      checkNearestEven(x, 0x7e, floatToE4m3Bits, e4m3BitsToFloat);
    if (x <= 57344.0f)
      checkNearestEven(x, 0x7b, floatToE5m2Bits, e5m2BitsToFloat);
    // Positive codes order like their values, so monotonic encoding means non-decreasing codes.
    REQUIRE(floatToE4m3Bits(x) >= previous_e4m3);
    REQUIRE(floatToE5m2Bits(x) >= previous_e5m2);
    previous_e4m3 = floatToE4m3Bits(x);
    previous_e5m2 = floatToE5m2Bits(x);
  });
  CHECK(previous_e4m3 == 0x7e);
  CHECK(previous_e5m2 == 0x7b);
}

// --- E2M1 and UE4M3 ---------------------------------------------------------------------------

TEST_CASE("e2m1: the eight magnitudes and the ties between them") {
  // Codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 8; ++code) {
    CHECK(e2m1BitsToFloat(code) == magnitudes[code]);
    CHECK(e2m1BitsToFloat(static_cast<uint8_t>(code | 0x8)) == -magnitudes[code]);
    CHECK(floatToE2m1Bits(magnitudes[code]) == code);
    CHECK(floatToE2m1Bits(-magnitudes[code]) == (code | 0x8));
  }
  CHECK(floatToE2m1Bits(0.25f) == 0x0); // tie between codes 0 and 1: even
  CHECK(floatToE2m1Bits(floatAbove(0.25f)) == 0x1);
  CHECK(floatToE2m1Bits(0.75f) == 0x2); // tie between 0.5 (1) and 1 (2)
  CHECK(floatToE2m1Bits(1.25f) == 0x2); // tie between 1 (2) and 1.5 (3)
  CHECK(floatToE2m1Bits(1.75f) == 0x4); // tie between 1.5 (3) and 2 (4)
  CHECK(floatToE2m1Bits(2.5f) == 0x4);  // tie between 2 (4) and 3 (5)
  CHECK(floatToE2m1Bits(3.5f) == 0x6);  // tie between 3 (5) and 4 (6)
  CHECK(floatToE2m1Bits(5.0f) == 0x6);  // tie between 4 (6) and 6 (7)
  CHECK(floatToE2m1Bits(floatAbove(5.0f)) == 0x7);
  CHECK(floatToE2m1Bits(-5.0f) == 0xe);
  CHECK(floatToE2m1Bits(-0.1f) == 0x8); // rounds to -0
}

TEST_CASE("e2m1: saturates at 6; NaN gives +6") {
  CHECK(floatToE2m1Bits(7.0f) == 0x7);
  CHECK(floatToE2m1Bits(100.0f) == 0x7);
  CHECK(floatToE2m1Bits(kInf) == 0x7);
  CHECK(floatToE2m1Bits(-kInf) == 0xf);
  CHECK(floatToE2m1Bits(kNan) == 0x7); // E2M1 has no NaN: CUDA's host conversion (cuda_fp4.h) also gives +6
  CHECK_THROWS_AS(e2m1BitsToFloat(16), std::invalid_argument);
}

TEST_CASE("e2m1: encoding is monotonic over the real line") {
  float previous = -6.0f;
  for (float x = -8.0f; x <= 8.0f; x += 0.0078125f) { // steps of 2^-7 hit every tie exactly
    const float rounded = e2m1BitsToFloat(floatToE2m1Bits(x));
    REQUIRE(rounded >= previous);
    previous = rounded;
  }
  CHECK(previous == 6.0f);
}

TEST_CASE("ue4m3: unsigned E4M3 scale, saturating; negative and NaN clamp to 0") {
  CHECK(floatToUe4m3Bits(1.0f) == 0x38);
  CHECK(floatToUe4m3Bits(0.1f) == 0x1d);        // as e4m3
  CHECK(floatToUe4m3Bits(1.0f / 6.0f) == 0x23); // 1.333 * 2^-3: E = 4, M = 2.67 -> 3 (0.171875)
  CHECK(floatToUe4m3Bits(1e-3f) == 0x01);
  CHECK(floatToUe4m3Bits(0x1p-10f) == 0x00); // tie with 0
  CHECK(floatToUe4m3Bits(448.0f) == 0x7e);
  CHECK(floatToUe4m3Bits(464.0f) == 0x7e);
  CHECK(floatToUe4m3Bits(1.0e6f) == 0x7e);
  CHECK(floatToUe4m3Bits(kInf) == 0x7e);
  CHECK(floatToUe4m3Bits(-1.0f) == 0x00);
  CHECK(floatToUe4m3Bits(-0.0f) == 0x00);
  CHECK(floatToUe4m3Bits(-kInf) == 0x00);
  CHECK(floatToUe4m3Bits(kNan) == 0x00);
  CHECK(ue4m3BitsToFloat(0x23) == 0.171875f);
  CHECK(ue4m3BitsToFloat(0x7e) == 448.0f);
  CHECK(std::isnan(ue4m3BitsToFloat(0x7f)));
  CHECK_THROWS_AS(ue4m3BitsToFloat(0x80), std::invalid_argument);
  for (uint8_t code = 0; code < 0x7f; ++code)
    REQUIRE(floatToUe4m3Bits(ue4m3BitsToFloat(code)) == code);
}

// --- integers ---------------------------------------------------------------------------------

TEST_CASE("int8: round half to even, symmetric saturation at 127") {
  CHECK(roundToInt8(0.5f) == 0);
  CHECK(roundToInt8(1.5f) == 2);
  CHECK(roundToInt8(2.5f) == 2);
  CHECK(roundToInt8(-0.5f) == 0);
  CHECK(roundToInt8(-1.5f) == -2);
  CHECK(roundToInt8(-2.5f) == -2);
  CHECK(roundToInt8(floatBelow(0.5f)) == 0);
  CHECK(roundToInt8(floatAbove(0.5f)) == 1);
  CHECK(roundToInt8(3.7f) == 4);
  CHECK(roundToInt8(-3.7f) == -4);
  CHECK(roundToInt8(126.5f) == 126);
  CHECK(roundToInt8(127.5f) == 127);
  CHECK(roundToInt8(200.0f) == 127);
  CHECK(roundToInt8(-200.0f) == -127);
  CHECK(roundToInt8(-127.5f) == -127);
  CHECK(roundToInt8(-128.0f) == -127); // -128 is never produced
  CHECK(roundToInt8(kInf) == 127);
  CHECK(roundToInt8(-kInf) == -127);
  CHECK(roundToInt8(kNan) == 0); // as cvt.rni.sat.s8.f32
}

TEST_CASE("int4: round half to even, saturation at 7") {
  CHECK(roundToInt4(5.5f) == 6);
  CHECK(roundToInt4(6.5f) == 6);
  CHECK(roundToInt4(-6.5f) == -6);
  CHECK(roundToInt4(7.5f) == 7);
  CHECK(roundToInt4(8.0f) == 7);
  CHECK(roundToInt4(-8.0f) == -7);
  CHECK(roundToInt4(0.49f) == 0);
  CHECK(roundToInt4(kNan) == 0);
}

TEST_CASE("int8 and int4: monotonic") {
  int previous8 = -127, previous4 = -7;
  for (float x = -300.0f; x <= 300.0f; x += 0.125f) {
    REQUIRE(roundToInt8(x) >= previous8);
    REQUIRE(roundToInt4(x) >= previous4);
    previous8 = roundToInt8(x);
    previous4 = roundToInt4(x);
  }
  CHECK(previous8 == 127);
  CHECK(previous4 == 7);
}
