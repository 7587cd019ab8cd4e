// Group quantizers of sage/numerics/Quantizers.h: symmetric scales, int8/int4/FP8 groups and the NVFP4
// row. Inputs are chosen so that every f32 step is exact or provably far from a rounding boundary, and
// each expected code is derived by hand in the comment beside it.
#include "sage/numerics/Quantizers.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

using namespace sage::numerics;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

uint32_t bitsOf(float value) { return std::bit_cast<uint32_t>(value); }

} // namespace

TEST_CASE("symmetricScale: two single f32 divisions") {
  // 1/127 = 2^-7 * (1 + 2^-7 + 2^-14 + 2^-21 + 2^-28 + ...): the bits after the 23rd fraction bit are
  // 2^-28 + ... < half an ulp (2^-24), so f32 keeps 2^-7 * (1 + 2^-7 + 2^-14 + 2^-21):
  // exponent 120 (0x78), fraction bits 16, 9 and 2 -> 0x3c010204.
  const SymmetricScale one = symmetricScale(1.0f, 127.0f);
  CHECK(bitsOf(one.scale) == 0x3c010204u);
  CHECK(one.inverse == 127.0f);
  // 10/127 is 0.(0001010) repeating in binary, never near a float midpoint, so the correctly rounded
  // decimal literal names the same float; 127/10 = 12.7 likewise.
  const SymmetricScale ten = symmetricScale(10.0f, 127.0f);
  CHECK(ten.scale == 0.0787401574803149606f);
  CHECK(ten.inverse == 12.7f);
  const SymmetricScale unit = symmetricScale(448.0f, 448.0f);
  CHECK(unit.scale == 1.0f);
  CHECK(unit.inverse == 1.0f);
}

TEST_CASE("symmetricScale: an all-zero group gets 0 and 0; bad arguments throw") {
  const SymmetricScale zero = symmetricScale(0.0f, 127.0f);
  CHECK(bitsOf(zero.scale) == 0u);
  CHECK(bitsOf(zero.inverse) == 0u);
  // An infinite amax is what the f32 ops give: inf / 127 = inf, 127 / inf = 0.
  const SymmetricScale infinite = symmetricScale(kInf, 127.0f);
  CHECK(infinite.scale == kInf);
  CHECK(infinite.inverse == 0.0f);
  CHECK_THROWS_AS(symmetricScale(-1.0f, 127.0f), std::invalid_argument);
  CHECK_THROWS_AS(symmetricScale(kNan, 127.0f), std::invalid_argument);
  CHECK_THROWS_AS(symmetricScale(1.0f, 0.0f), std::invalid_argument);
  CHECK_THROWS_AS(symmetricScale(1.0f, -7.0f), std::invalid_argument);
  CHECK_THROWS_AS(symmetricScale(1.0f, kInf), std::invalid_argument);
}

TEST_CASE("quantizeInt8: amax over |x|, codes round half to even") {
  {
    // amax = |-127| = 127: scale 1, inverse 1, so codes are the values rounded.
    const std::vector<float> values = {127.0f, -0.5f, 1.5f, -2.5f, 63.5f, -127.0f, 3.2f};
    std::vector<int8_t> codes(values.size());
    CHECK(quantizeInt8(values, codes) == 1.0f);
    CHECK(codes == std::vector<int8_t>{127, 0, 2, -2, 64, -127, 3});
  }
  {
    // amax = 0.5: inverse = 127 / 0.5 = 254 exactly; scale = 0.5 / 127 = (1/127) / 2, i.e. 0x3c010204
    // with the exponent one lower: 0x3b810204.
    const std::vector<float> values = {0.5f, -0.25f, 0.001f, 511.0f / 1024.0f, -0.5f};
    std::vector<int8_t> codes(values.size());
    CHECK(bitsOf(quantizeInt8(values, codes)) == 0x3b810204u);
    // 0.5 * 254 = 127; -0.25 * 254 = -63.5 -> -64 (even); 0.001 * 254 = 0.254 -> 0;
    // 511/1024 * 254 = 126.75 -> 127; -0.5 * 254 = -127.
    CHECK(codes == std::vector<int8_t>{127, -64, 0, 127, -127});
  }
}

TEST_CASE("quantizeInt8: NaN is ignored by amax and gives code 0") {
  // amax = 2 (the NaN never wins max), inverse = 127 / 2 = 63.5: 2 -> 127, -1 -> -63.5 -> -64.
  const std::vector<float> values = {kNan, 2.0f, -1.0f};
  std::vector<int8_t> codes(values.size());
  quantizeInt8(values, codes);
  CHECK(codes == std::vector<int8_t>{0, 127, -64});
}

TEST_CASE("quantizeInt4: qmax 7") {
  // amax = 14: scale 2, inverse 0.5. 14 -> 7; 3 -> 1.5 -> 2; -5 -> -2.5 -> -2; 1 -> 0.5 -> 0; -14 -> -7.
  const std::vector<float> values = {14.0f, 3.0f, -5.0f, 1.0f, -14.0f, 0.0f};
  std::vector<int8_t> codes(values.size());
  CHECK(quantizeInt4(values, codes) == 2.0f);
  CHECK(codes == std::vector<int8_t>{7, 2, -2, 0, -7, 0});
}

TEST_CASE("quantizers: all-zero groups give scale 0 and zero codes") {
  const std::vector<float> zeros = {0.0f, 0.0f, -0.0f, 0.0f};
  std::vector<int8_t> int_codes(zeros.size(), 99);
  CHECK(bitsOf(quantizeInt8(zeros, int_codes)) == 0u);
  CHECK(int_codes == std::vector<int8_t>{0, 0, 0, 0});
  std::fill(int_codes.begin(), int_codes.end(), 99);
  CHECK(bitsOf(quantizeInt4(zeros, int_codes)) == 0u);
  CHECK(int_codes == std::vector<int8_t>{0, 0, 0, 0});
  // FP8 keeps the sign of zero: -0 * 0 = -0 encodes as 0x80, which decodes to -0 (== 0).
  std::vector<uint8_t> fp8_codes(zeros.size(), 99);
  CHECK(bitsOf(quantizeE4m3(zeros, fp8_codes)) == 0u);
  CHECK(fp8_codes == std::vector<uint8_t>{0x00, 0x00, 0x80, 0x00});
  std::fill(fp8_codes.begin(), fp8_codes.end(), 99);
  CHECK(bitsOf(quantizeE5m2(zeros, fp8_codes)) == 0u);
  CHECK(fp8_codes == std::vector<uint8_t>{0x00, 0x00, 0x80, 0x00});
  // An empty group is all-zero too.
  CHECK(quantizeInt8({}, {}) == 0.0f);
}

TEST_CASE("quantizeE4m3: scale = amax / 448, codes = e4m3(x * inverse)") {
  {
    // amax 448: scale 1, inverse 1; codes as in the scalar e4m3 derivations:
    // 448 -> 0x7e; -300 -> -288 -> 0xf9; 0.1 -> 0x1d; 1e-3 -> 0x01; 17 -> 16 -> 0x58; -1.1875 -> 0xba.
    const std::vector<float> values = {448.0f, -300.0f, 0.1f, 1e-3f, 17.0f, -1.1875f};
    std::vector<uint8_t> codes(values.size());
    CHECK(quantizeE4m3(values, codes) == 1.0f);
    CHECK(codes == std::vector<uint8_t>{0x7e, 0xf9, 0x1d, 0x01, 0x58, 0xba});
  }
  {
    // amax 896: scale 2, inverse 0.5. 896 -> 448 (0x7e); 600 -> 300 -> 288 (0x79);
    // -1 -> -0.5 = 2^-1 (E = 6, M = 0: 0x30, negative 0xb0); 2^-10 -> 2^-11 = 0.25 quanta -> 0.
    const std::vector<float> values = {896.0f, 600.0f, -1.0f, 0x1p-10f};
    std::vector<uint8_t> codes(values.size());
    CHECK(quantizeE4m3(values, codes) == 2.0f);
    CHECK(codes == std::vector<uint8_t>{0x7e, 0x79, 0xb0, 0x00});
  }
}

TEST_CASE("quantizeE5m2: scale = amax / 57344") {
  // amax 57344: scale 1, inverse 1. 57344 -> 0x7b; 0.1 -> 0x2e; -1 -> 0xbc; 448 -> 0x5f.
  const std::vector<float> values = {57344.0f, 0.1f, -1.0f, 448.0f};
  std::vector<uint8_t> codes(values.size());
  CHECK(quantizeE5m2(values, codes) == 1.0f);
  CHECK(codes == std::vector<uint8_t>{0x7b, 0x2e, 0xbc, 0x5f});
}

TEST_CASE("quantizers: mismatched spans throw") {
  const std::vector<float> values = {1.0f, 2.0f, 3.0f};
  std::vector<int8_t> short_codes(2);
  std::vector<uint8_t> short_bytes(2);
  CHECK_THROWS_AS(quantizeInt8(values, short_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeInt4(values, short_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeE4m3(values, short_bytes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeE5m2(values, short_bytes), std::invalid_argument);
}

// --- NVFP4 ------------------------------------------------------------------------------------

TEST_CASE("quantizeNvfp4Row: a row of 32 values, checked by hand") {
  // global_scale 2: every x / 2 below is exact, giving the values v in the comments.
  const std::array<float, 32> values = {
      // Group 0, v = {6, -6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -5, 0.3, -0.1, 0, -0, 4, 1.5}: amax 6,
      // 6 / 6 = 1 = UE4M3 0x38, inverse 1, so the codes are e2m1(v) with ties to even.
      12.0f, -12.0f, 0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f, -10.0f, 0.6f, -0.2f, 0.0f, -0.0f, 8.0f, 3.0f,
      // Group 1, v = {1, 0.5, 0.25, -0.125, 0.0625, 0.03125, 0.75, -0.375, 0.6875, 0.171875, -1, 0.4, 0.9,
      // -0.55, 0.2, 0.1}: amax 1; 1/6 = 1.333 * 2^-3 -> UE4M3 E = 4, M = 2.67 -> 3: 0x23 = 0.171875;
      // inverse = 1 / 0.171875 = 64/11 = 5.8182 (f32), and v * 5.8182 is far from every E2M1 tie.
      2.0f, 1.0f, 0.5f, -0.25f, 0.125f, 0.0625f, 1.5f, -0.75f, 1.375f, 0.34375f, -2.0f, 0.8f, 1.8f, -1.1f, 0.4f, 0.2f};
  std::array<uint8_t, 32> codes{};
  std::array<uint8_t, 2> scale_codes{};
  quantizeNvfp4Row(values, 2.0f, codes, scale_codes);
  CHECK(scale_codes == std::array<uint8_t, 2>{0x38, 0x23});
  const std::array<uint8_t, 32> expected = {
      // Group 0: 6 -> 7; -6 -> 0xf; 0.25 -> 0 (tie, even); 0.75 -> 2 (tie); 1.25 -> 2 (tie); 1.75 -> 4 (tie);
      // 2.5 -> 4 (tie); 3.5 -> 6 (tie); 5 -> 6 (tie); -5 -> 0xe; 0.3 -> 1 (0.5); -0.1 -> -0 (0x8); 0 -> 0;
      // -0 -> 0x8; 4 -> 6; 1.5 -> 3.
      0x7, 0xf, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xe, 0x1, 0x8, 0x0, 0x8, 0x6, 0x3,
      // Group 1, v * 5.8182: 5.82 -> 6 (7); 2.91 -> 3 (5); 1.45 -> 1.5 (3); -0.73 -> -0.5 (9); 0.36 -> 0.5 (1);
      // 0.18 -> 0 (0); 4.36 -> 4 (6); -2.18 -> -2 (0xc); 4.0 -> 4 (6); 1.0 -> 1 (2); -5.82 -> -6 (0xf);
      // 2.33 -> 2 (4); 5.24 -> 6 (7); -3.2 -> -3 (0xd); 1.16 -> 1 (2); 0.58 -> 0.5 (1).
      0x7, 0x5, 0x3, 0x9, 0x1, 0x0, 0x6, 0xc, 0x6, 0x2, 0xf, 0x4, 0x7, 0xd, 0x2, 0x1};
  CHECK(codes == expected);
}

TEST_CASE("quantizeNvfp4Row: partial last group, saturated and underflowing scales") {
  // 20 values: group 0 has 16, group 1 has 4.
  std::vector<float> values(20, 0.0f);
  // Group 0: 1e6 -> amax / 6 = 166666.7 > 448: UE4M3 saturates (0x7e); 1e6 / 448 = 2232 saturates E2M1 (7).
  values[0] = 1.0e6f;
  values[1] = -1.0e6f;
  // Group 1: amax 1e-4, 1e-4 / 6 = 1.7e-5 is below half of 2^-9 (the smallest UE4M3): scale code 0,
  // inverse 0, every code +-0.
  values[16] = 1.0e-4f;
  values[17] = -1.0e-4f;
  std::vector<uint8_t> codes(20, 99);
  std::vector<uint8_t> scale_codes(2, 99);
  quantizeNvfp4Row(values, 1.0f, codes, scale_codes);
  CHECK(scale_codes == std::vector<uint8_t>{0x7e, 0x00});
  CHECK(codes[0] == 0x7);
  CHECK(codes[1] == 0xf);
  CHECK(codes[2] == 0x0); // 0 * (1/448) = 0
  CHECK(codes[16] == 0x0);
  CHECK(codes[17] == 0x8); // -1e-4 * 0 = -0
  CHECK(codes[19] == 0x0);
}

TEST_CASE("quantizeNvfp4Row: an all-zero row and bad arguments") {
  std::vector<float> zeros(16, 0.0f);
  std::vector<uint8_t> codes(16, 99);
  std::vector<uint8_t> scale_codes(1, 99);
  quantizeNvfp4Row(zeros, 1.0f, codes, scale_codes);
  CHECK(scale_codes[0] == 0x00);
  CHECK(codes == std::vector<uint8_t>(16, 0x0));

  std::vector<uint8_t> no_scales;
  std::vector<uint8_t> short_codes(15);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, 0.0f, codes, scale_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, -1.0f, codes, scale_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, kNan, codes, scale_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, kInf, codes, scale_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, 1.0f, short_codes, scale_codes), std::invalid_argument);
  CHECK_THROWS_AS(quantizeNvfp4Row(zeros, 1.0f, codes, no_scales), std::invalid_argument);
}

// --- MXFP4 and the scale codes -----------------------------------------------------------------

TEST_CASE("nvfp4ScaleBits and mxfp4ScaleBits: one scale code per group amax") {
  CHECK(nvfp4ScaleBits(6.0f) == 0x38);    // 6 / 6 = 1
  CHECK(nvfp4ScaleBits(1.0f) == 0x23);    // 1/6 -> 0.171875
  CHECK(nvfp4ScaleBits(0.0f) == 0x00);    // all-zero group
  CHECK(nvfp4ScaleBits(1.0e6f) == 0x7e);  // saturates at 448
  CHECK(mxfp4ScaleBits(3.0f) == 126);     // floor(log2 3) = 1, minus 2: 2^-1
  CHECK(mxfp4ScaleBits(4.0f) == 127);     // 2^2 / 2^2 = 1
  CHECK(mxfp4ScaleBits(7.99f) == 127);    // still 2^0: 7.99 saturates to 6
  CHECK(mxfp4ScaleBits(0.75f) == 124);    // floor(log2 0.75) = -1, minus 2: 2^-3
  CHECK(mxfp4ScaleBits(0.0f) == 0);       // all-zero group: 2^-127
  CHECK(mxfp4ScaleBits(0x1p-140f) == 0);  // below 2^-125: clamped to the smallest scale
  CHECK(mxfp4ScaleBits(0x1p126f) == 251); // 126 - 2 + 127
  CHECK(mxfp4ScaleBits(kInf) == 254);     // clamped to the largest scale
  CHECK(ue8m0BitsToFloat(127) == 1.0f);
  CHECK(ue8m0BitsToFloat(126) == 0.5f);
  CHECK(ue8m0BitsToFloat(0) == 0x1p-127f);
  CHECK(ue8m0BitsToFloat(254) == 0x1p127f);
  CHECK(std::isnan(ue8m0BitsToFloat(255)));
}

TEST_CASE("quantizeMxfp4Row: 32-value groups, power-of-two scales, a partial last group") {
  std::vector<float> values(35, 0.0f);
  // Group 0 (32 values): amax 3 -> scale 2^-1 (code 126), inverse 2; v = 2x:
  // 3 -> 6 (0x7); 1.25 -> 2.5, tie of 2 and 3 -> 2 (even code 0x4); -0.2 -> -0.4 -> -0.5 (0x9);
  // 0.1 -> 0.2 -> 0 (0x0); 2 -> 4 (0x6); -1.75 -> -3.5, tie of 3 and 4 -> -4 (even code 0xe); the 0s -> 0x0.
  const std::array<float, 6> group0 = {3.0f, 1.25f, -0.2f, 0.1f, 2.0f, -1.75f};
  std::copy(group0.begin(), group0.end(), values.begin());
  // Group 1 (3 values): amax 7 -> floor(log2 7) = 2 -> scale 2^0 (code 127): 7 -> saturates to 6 (0x7),
  // 6.5 -> 6 (0x7), -5 -> tie of 4 and 6 -> -4 (even code 0xe).
  values[32] = 7.0f;
  values[33] = 6.5f;
  values[34] = -5.0f;
  std::vector<uint8_t> codes(35, 99);
  std::vector<uint8_t> scale_codes(2, 99);
  quantizeMxfp4Row(values, codes, scale_codes);
  CHECK(scale_codes == std::vector<uint8_t>{126, 127});
  CHECK(std::vector<uint8_t>(codes.begin(), codes.begin() + 6) == std::vector<uint8_t>{0x7, 0x4, 0x9, 0x0, 0x6, 0xe});
  CHECK(std::all_of(codes.begin() + 6, codes.begin() + 32, [](uint8_t code) { return code == 0x0; }));
  CHECK(std::vector<uint8_t>(codes.begin() + 32, codes.end()) == std::vector<uint8_t>{0x7, 0x7, 0xe});

  std::vector<uint8_t> one_scale(1);
  std::vector<uint8_t> short_codes(34);
  CHECK_THROWS_AS(quantizeMxfp4Row(values, codes, one_scale), std::invalid_argument);
  CHECK_THROWS_AS(quantizeMxfp4Row(values, short_codes, scale_codes), std::invalid_argument);
}

TEST_CASE("quantizeInt4: symmetric [-7, 7], the negative amax maps to -7 too") {
  // amax = |-3.5| = 3.5: scale 0.5, inverse 2 (both exact). v = 2x: -3.5 -> -7; 3.5 -> 7; 0.25 -> 0.5 -> 0
  // (tie, even); 0.75 -> 1.5 -> 2 (tie, even); -1.3 -> -2.6 -> -3; 1.0 -> 2.
  const std::vector<float> values = {-3.5f, 3.5f, 0.25f, 0.75f, -1.3f, 1.0f};
  std::vector<int8_t> codes(values.size());
  CHECK(quantizeInt4(values, codes) == 0.5f);
  CHECK(codes == std::vector<int8_t>{-7, 7, 0, 2, -3, 2});
}
