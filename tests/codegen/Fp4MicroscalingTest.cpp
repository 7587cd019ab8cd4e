// The device library's FP4 microscaling arithmetic (codegen/device/sage/device/fp4/microscaling.cuh), compiled as
// host C++, against sage::numerics, the quantizers of the CPU reference: every code and scale bit for bit, on a
// sweep of f32 bit patterns (every sign and exponent, the grid's midpoints and their neighbours) and on whole rows;
// and P~'s two-level and direct microscaling against reference::quantizeProbabilities.
#include "../../codegen/device/sage/device/fp4/microscaling.cuh"
#include "../../dsl/reference/OperandQuantizer.h"

#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fp4 = sage::device::fp4;
namespace numerics = sage::numerics;

namespace {

float fromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Every 65537th bit pattern (all signs and exponents, NaNs and infinities included), and each value of `anchors`
// with its f32 neighbours: the boundaries where rounding changes its mind.
std::vector<float> sweep(const std::vector<float> &anchors) {
  std::vector<float> values;
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 65537)
    values.push_back(fromBits(static_cast<uint32_t>(bits)));
  for (float anchor : anchors)
    for (float sign : {1.0f, -1.0f}) {
      const float value = sign * anchor;
      values.push_back(value);
      values.push_back(std::nextafter(value, std::numeric_limits<float>::infinity()));
      values.push_back(std::nextafter(value, -std::numeric_limits<float>::infinity()));
    }
  for (float special : {0.0f, -0.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()})
    values.push_back(special);
  return values;
}

} // namespace

TEST_CASE("e2m1_code and e2m1_value are floatToE2m1Bits and e2m1BitsToFloat") {
  const std::vector<float> values =
      sweep({0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f, 1e-30f});
  int checked = 0;
  for (float value : values) {
    CAPTURE(value);
    CHECK(fp4::e2m1_code(value) == numerics::floatToE2m1Bits(value));
    ++checked;
  }
  CHECK(checked > 65000);
  for (unsigned code = 0; code < 16; ++code) {
    CAPTURE(code);
    const float expected = numerics::e2m1BitsToFloat(static_cast<uint8_t>(code)), actual = fp4::e2m1_value(code);
    CHECK(actual == expected);
    CHECK(std::signbit(actual) == std::signbit(expected));
  }
}

TEST_CASE("ue4m3_code and ue4m3_value are floatToUe4m3Bits and ue4m3BitsToFloat") {
  std::vector<float> anchors = {448.0f, 464.0f, 480.0f, 0.015625f, 0.001953125f, 0.0009765625f};
  for (unsigned code = 1; code < 0x7f; ++code) { // every code and the midpoints around it
    const float value = numerics::ue4m3BitsToFloat(static_cast<uint8_t>(code));
    const float next = numerics::ue4m3BitsToFloat(static_cast<uint8_t>(code + 1 < 0x7f ? code + 1 : code));
    anchors.push_back(value);
    anchors.push_back(0.5f * (value + next));
  }
  for (float value : sweep(anchors)) {
    CAPTURE(value);
    CHECK(fp4::ue4m3_code(value) == numerics::floatToUe4m3Bits(value));
  }
  for (unsigned code = 0; code < 0x7f; ++code) { // 0x7f is E4M3's NaN, which no scale takes
    CAPTURE(code);
    CHECK(fp4::ue4m3_value(code) == numerics::ue4m3BitsToFloat(static_cast<uint8_t>(code)));
  }
}

TEST_CASE("the NVFP4 and MXFP4 scales are nvfp4ScaleBits and mxfp4ScaleBits, with exact inverses") {
  std::vector<float> anchors = {6.0f, 2688.0f, 2784.0f, 0.09375f, 1e-38f, 3e38f};
  for (int exponent = -149; exponent < 128; ++exponent)
    anchors.push_back(std::ldexp(1.0f, exponent));
  for (float amax : sweep(anchors)) {
    if (std::signbit(amax) && !std::isnan(amax))
      continue; // an amax is a magnitude
    CAPTURE(amax);
    CHECK(fp4::nvfp4_scale_code(amax) == numerics::nvfp4ScaleBits(amax));
    CHECK(fp4::mxfp4_scale_code(amax) == numerics::mxfp4ScaleBits(amax));
  }
  for (unsigned code = 0; code < 0x7f; ++code) {
    const float scale = numerics::ue4m3BitsToFloat(static_cast<uint8_t>(code));
    CHECK(fp4::nvfp4_inverse(code) == (scale > 0.0f ? 1.0f / scale : 0.0f));
  }
  for (unsigned code = 0; code < 255; ++code) {
    CAPTURE(code);
    CHECK(fp4::mxfp4_inverse(code) == std::ldexp(1.0f, 127 - static_cast<int>(code)));
    CHECK(fp4::ue8m0_value(code) == numerics::ue8m0BitsToFloat(static_cast<uint8_t>(code)));
  }
}

TEST_CASE("rows quantized 8 values at a time are quantizeNvfp4Row's and quantizeMxfp4Row's codes and scales") {
  std::mt19937 generator(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int row = 0; row < 200; ++row) {
    // Rows of different magnitudes (subnormal to huge), some with zero groups and outliers.
    const float magnitude = std::ldexp(1.0f, row % 60 - 30) * (row % 7 == 0 ? 1e-35f : 1.0f);
    std::vector<float> values(128);
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = (row % 5 == 0 && i < 32) ? 0.0f : normal(generator) * magnitude * (i % 29 == 0 ? 40.0f : 1.0f);
    for (bool mx : {false, true}) {
      const size_t group = mx ? 32 : 16;
      std::vector<uint8_t> codes(values.size()), scales(values.size() / group);
      if (mx)
        numerics::quantizeMxfp4Row(values, codes, scales);
      else
        numerics::quantizeNvfp4Row(values, 1.0f, codes, scales);
      for (size_t first = 0; first < values.size(); first += group) {
        float amax = 0.0f;
        for (size_t i = first; i < first + group; ++i)
          amax = fp4::max_magnitude(amax, values[i]);
        const unsigned scale = mx ? fp4::mxfp4_scale_code(amax) : fp4::nvfp4_scale_code(amax);
        CHECK(scale == scales[first / group]);
        const float inverse = mx ? fp4::mxfp4_inverse(scale) : fp4::nvfp4_inverse(scale);
        for (size_t vector = first; vector < first + group; vector += 8) {
          float x[8];
          for (int j = 0; j < 8; ++j)
            x[j] = values[vector + j];
          const unsigned packed = fp4::pack_e2m1x8(x, inverse);
          for (int j = 0; j < 8; ++j)
            CHECK((packed >> (4 * j) & 0xfu) == codes[vector + j]);
        }
      }
    }
  }
}

TEST_CASE("P~ microscaled with the group-generic helpers (NVFP4 two-level and direct, MXFP4) is "
          "reference::quantizeProbabilities, value for value") {
  std::mt19937 generator(13);
  std::exponential_distribution<double> distance(0.7);
  for (const char *name : {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4"}) {
    CAPTURE(name);
    const sage::QuantizerSpec spec = sage::dsl::preset(name, 128)->describe().p;
    const bool two_level = spec.two_level;
    const int group = sage::microscaleGroupSize(spec.granularity);
    CHECK(two_level == (std::string(name) == "sage3-fp4"));
    for (int row_index = 0; row_index < 300; ++row_index) {
      // P~ = 2^(S - m) of one block's row: values in (0, 1], a 1 where the row's max lies (not in every block), and
      // zeros (masked columns); some rows far below the running max.
      std::vector<double> row(64);
      const double offset = row_index % 4 == 0 ? 40.0 : (row_index % 4 == 1 ? 0.0 : 3.0);
      for (size_t i = 0; i < row.size(); ++i)
        row[i] = (row_index % 9 == 0 && i % 5 == 0) ? 0.0 : std::exp2(-distance(generator) - offset);
      if (row_index % 4 == 1)
        row[row_index % 64] = 1.0;
      if (row_index == 7)
        std::fill(row.begin(), row.end(), 0.0); // a fully masked block row
      std::vector<double> expected = row;
      sage::reference::quantizeProbabilities(expected, spec);

      // The attention kernel's steps (sm80/fp4_steps.cuh, quantize_probabilities): the row max of P~ (a quad max of
      // fmaxf over non-negative values), s_P1, then per group the amax, its scale code, value and inverse.
      float row_max = 0.0f;
      for (double p : row)
        row_max = std::fmax(row_max, static_cast<float>(p));
      const fp4::RowScale row_scale = two_level ? fp4::probability_row_scale(row_max) : fp4::RowScale{1.0f, 1.0f};
      for (size_t first = 0; first < row.size(); first += static_cast<size_t>(group)) {
        float x[32], amax = 0.0f;
        for (int j = 0; j < group; ++j) {
          const float p = static_cast<float>(row[first + j]);
          x[j] = two_level ? fp4::multiply_rn(p, row_scale.inverse) : p;
          amax = fp4::max_magnitude(amax, x[j]);
        }
        const unsigned scale_code = fp4::microscale_code(amax, group);
        for (int j = 0; j < group; ++j) {
          const float value = fp4::quantize_probability(x[j], fp4::microscale_value(scale_code, group),
                                                        fp4::microscale_inverse(scale_code, group));
          CAPTURE(row_index);
          CAPTURE(first + j);
          CHECK(static_cast<double>(value) * static_cast<double>(row_scale.scale) == expected[first + j]);
        }
      }
    }
  }
}

namespace {

// Whether `value` is exactly a binary floating-point number with `precision` significant bits and `min_exponent` the
// exponent of its smallest normal (f16: 11 and -14, max 65504; bf16: 8 and -126, max ~3.4e38).
bool representable(float value, int precision, int min_exponent, double max) {
  const double a = std::fabs(static_cast<double>(value));
  if (a == 0.0)
    return true;
  if (a > max)
    return false;
  const int exponent = std::max(std::ilogb(a), min_exponent); // subnormals keep the smallest normal's spacing
  const double steps = std::ldexp(a, precision - 1 - exponent);
  return steps == std::floor(steps);
}

} // namespace

TEST_CASE("decode_e2m1x8 gives the reference's dequantized Q/K/V, exactly representable in the emulation's mma type") {
  std::mt19937 generator(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char *name : {"sage3-fp4", "sage3-mxfp4"}) {
    CAPTURE(name);
    const sage::QuantizerSpec spec = sage::dsl::preset(name, 128)->describe().k;
    const int group = sage::microscaleGroupSize(spec.granularity);
    const bool bf16 = sage::fp4DecodedType(spec.granularity) == sage::ElementType::bf16;
    CHECK(bf16 == (group == 32));
    for (int row = 0; row < 120; ++row) {
      const float magnitude = std::ldexp(1.0f, row % 48 - 24);
      sage::reference::OperandMatrix matrix{1, 128, {}};
      for (int c = 0; c < 128; ++c)
        matrix.values.push_back((row % 5 == 0 && c < 32) ? 0.0f : normal(generator) * magnitude * (c % 29 ? 1 : 40));
      const std::vector<double> expected = sage::reference::quantizeOperand(matrix, spec, 1);
      for (int first = 0; first < 128; first += group) {
        float amax = 0.0f;
        for (int c = first; c < first + group; ++c)
          amax = fp4::max_magnitude(amax, matrix.values[c]);
        const unsigned scale_code = fp4::microscale_code(amax, group);
        for (int word = first; word < first + group; word += 8) {
          float x[8];
          std::copy_n(matrix.values.begin() + word, 8, x);
          float decoded[8];
          fp4::decode_e2m1x8(fp4::pack_e2m1x8(x, fp4::microscale_inverse(scale_code, group)),
                             fp4::microscale_value(scale_code, group), decoded);
          for (int j = 0; j < 8; ++j) {
            CAPTURE(row);
            CAPTURE(word + j);
            CHECK(static_cast<double>(decoded[j]) == expected[word + j]);
            CHECK(bf16 ? representable(decoded[j], 8, -126, 3.3895313892515355e38)
                       : representable(decoded[j], 11, -14, 65504.0));
          }
        }
      }
    }
  }
}
