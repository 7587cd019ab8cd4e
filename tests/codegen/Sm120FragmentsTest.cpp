// The sm120 FP4 kernel's fragment maps (codegen/device/sage/device/sm120/fragments.cuh, compiled here by the host
// compiler): the permutation of S's columns makes the Q.K^T accumulator the P.V A operand, every slot once; P's
// scale registers come from the lanes that hold their groups; and a warp-level model of the kernel's P quantization
// (the same steps as quantize_probabilities in attention.cuh, on the host's bit-exact conversions) decodes to what the
// CPU reference's quantizeProbabilities gives, bit for bit, for NVFP4 (two-level and direct) and MXFP4.
#include "../../codegen/device/sage/device/sm120/fragments.cuh"
#include "../../dsl/reference/OperandQuantizer.h"

#include "sage/numerics/Quantizers.h"
#include "sage/schedules/Sm120Schedule.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

using namespace sage;
using namespace sage::device::sm120;

namespace {

constexpr int kRows = 16, kChunk = 64, kLanes = 32;

// One warp's P.V operands for one 16 x 64 chunk, as the kernel builds them.
struct WarpOperands {
  std::array<std::array<uint32_t, 4>, kLanes> a{};
  std::array<uint32_t, kLanes> scale_a{};
  float first_scale[kRows] = {};
};

// The kernel's steps on the host: S's accumulator of lane `lane`, tile j, element e holds the score of token
// score_column_token(8j + column); two-level P divides by s_P1 = rowmax / 2688 first; each half-row of four tiles
// takes its microscale over the lanes of its group, then packs e2m1 pairs; the scale word gathers the group codes.
WarpOperands quantizeLikeTheKernel(const std::vector<std::vector<float>> &p, int scale_group, bool two_level) {
  float value[kLanes][8][4];
  float inverse_first[kRows];
  WarpOperands out;
  for (int row = 0; row < kRows; ++row) {
    const float amax = *std::max_element(p[row].begin(), p[row].end()); // the row max reused (P~ >= 0)
    const numerics::SymmetricScale first = numerics::symmetricScale(amax, 2688.0f);
    out.first_scale[row] = two_level ? first.scale : 1.0f;
    inverse_first[row] = two_level ? first.inverse : 1.0f;
  }
  for (int lane = 0; lane < kLanes; ++lane)
    for (int tile = 0; tile < 8; ++tile)
      for (int e = 0; e < 4; ++e) {
        const int row = accumulator_row(lane, e);
        value[lane][tile][e] = p[row][score_column_token(tile * 8 + accumulator_column(lane, e))] * inverse_first[row];
      }
  uint32_t codes[kLanes][2][2];
  for (int lane = 0; lane < kLanes; ++lane)
    for (int half = 0; half < 2; ++half)
      for (int part = 0; part < 2; ++part) {
        float amax = 0.0f; // over the lanes that share the group: lane ^ 1 (16 tokens) or the quad (32)
        for (int other = 0; other < kLanes; ++other) {
          const bool shares = scale_group == 16 ? (other ^ lane) <= 1 : other / 4 == lane / 4;
          if (shares)
            for (int t = 0; t < 4; ++t)
              amax = std::max({amax, value[other][part * 4 + t][2 * half], value[other][part * 4 + t][2 * half + 1]});
        }
        float inverse;
        if (scale_group == 16) {
          codes[lane][half][part] = numerics::nvfp4ScaleBits(amax);
          const float scale = numerics::ue4m3BitsToFloat(static_cast<uint8_t>(codes[lane][half][part]));
          inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
        } else {
          codes[lane][half][part] = numerics::mxfp4ScaleBits(amax);
          inverse = std::ldexp(1.0f, 127 - static_cast<int>(codes[lane][half][part]));
        }
        uint32_t packed = 0;
        for (int t = 0; t < 4; ++t) {
          const int tile = part * 4 + t;
          const uint32_t low = numerics::floatToE2m1Bits(value[lane][tile][2 * half] * inverse);
          const uint32_t high = numerics::floatToE2m1Bits(value[lane][tile][2 * half + 1] * inverse);
          packed |= (low | high << 4) << (8 * t);
        }
        out.a[lane][p_register(part * 4, 2 * half)] = packed;
      }
  for (int lane = 0; lane < kLanes; ++lane) {
    const int half = lane % 2;
    if (scale_group == 16)
      out.scale_a[lane] =
          codes[p_scale_source_lane(lane, 0)][half][0] | codes[p_scale_source_lane(lane, 1)][half][0] << 8 |
          codes[p_scale_source_lane(lane, 2)][half][1] << 16 | codes[p_scale_source_lane(lane, 3)][half][1] << 24;
    else
      out.scale_a[lane] = codes[lane][half][0] | codes[lane][half][1] << 8;
  }
  return out;
}

// What the block-scaled mma reads: element (row, k) of A times its scale, times the row's s_P1.
double dequantized(const WarpOperands &operands, int row, int k, int scale_group) {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int reg = 0; reg < 4; ++reg)
      for (int nibble = 0; nibble < 8; ++nibble)
        if (a_row(lane, reg) == row && a_k(lane, reg, nibble) == k) {
          const uint8_t code = (operands.a[lane][reg] >> (4 * nibble)) & 0xf;
          const int scale_lane = (lane & ~3) | (row >= 8 ? 1 : 0); // a lane whose scale_a_row is `row`
          REQUIRE(scale_a_row(scale_lane) == row);
          const uint8_t scale_code = (operands.scale_a[scale_lane] >> (8 * (k / scale_group))) & 0xff;
          const double scale =
              scale_group == 16 ? numerics::ue4m3BitsToFloat(scale_code) : numerics::ue8m0BitsToFloat(scale_code);
          return static_cast<double>(numerics::e2m1BitsToFloat(code)) * scale * operands.first_scale[row];
        }
  FAIL("no A slot holds row " << row << ", k " << k);
  return 0.0;
}

QuantizerSpec probabilitySpec(int scale_group, bool two_level) {
  QuantizerSpec spec;
  spec.dtype = ElementType::e2m1;
  spec.granularity = scale_group == 16 ? Granularity::microscale_1x16 : Granularity::microscale_1x32;
  spec.scale_type = scale_group == 16 ? ScaleType::ue4m3 : ScaleType::ue8m0;
  spec.two_level = two_level;
  return spec;
}

} // namespace

TEST_CASE("S's column permutation is the schedule's, a permutation of every 32 columns, and its own inverse") {
  for (int column = 0; column < 128; ++column) {
    CHECK(score_column_token(column) == schedules::fp4ScoreColumnToken(column));
    CHECK(score_column_token(column) / 32 == column / 32);
    CHECK(score_column_token(score_column_token(column)) == column);
  }
  CHECK(score_column_token(2) == 8); // tile 0, lane q = 1: token 8 (A register 0 of q = 1 starts at k = 8)
  CHECK(score_column_token(8) == 2); // tile 1, lane q = 0: token 2
}

TEST_CASE("the S accumulator of a 64-column chunk is P's A operand in place, every slot once") {
  std::vector<int> hits(kRows * kChunk, 0);
  for (int lane = 0; lane < kLanes; ++lane)
    for (int tile = 0; tile < 8; ++tile)
      for (int e = 0; e < 4; ++e) {
        const int row = accumulator_row(lane, e);
        const int token = score_column_token(tile * 8 + accumulator_column(lane, e));
        const int reg = p_register(tile, e), nibble = p_nibble(tile, e);
        CHECK(a_row(lane, reg) == row);
        CHECK(a_k(lane, reg, nibble) == token);
        ++hits[row * kChunk + token];
      }
  CHECK(std::all_of(hits.begin(), hits.end(), [](int count) { return count == 1; }));
  // K's B operand reads row score_column_token(8j + g): the same token the accumulator column gets.
  for (int lane = 0; lane < kLanes; ++lane)
    CHECK(b_column(lane) == accumulator_row(lane, 0));
}

TEST_CASE("P's NVFP4 scale bytes come from the lanes holding their 16-token groups, of the same row") {
  for (int lane = 0; lane < kLanes; ++lane)
    for (int group = 0; group < 4; ++group) {
      const int source = p_scale_source_lane(lane, group);
      CHECK(source / 4 == lane / 4);
      CHECK(a_row(source, group / 2 * 2 + lane % 2) == scale_a_row(lane)); // the source's row half is the lane's
      for (int nibble = 0; nibble < 8; ++nibble)
        CHECK(a_k(source, (group / 2) * 2, nibble) / 16 == group);
    }
}

TEST_CASE("the kernel's P quantization decodes to the reference's quantizeProbabilities, bit for bit") {
  std::mt19937 random(20261123);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (int scale_group : {16, 32})
    for (bool two_level : {true, false}) {
      CAPTURE(scale_group);
      CAPTURE(two_level);
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<std::vector<float>> p(kRows, std::vector<float>(kChunk));
        for (int row = 0; row < kRows; ++row)
          for (float &value : p[row]) // P~ = exp2(S - m): spread over many octaves, some exact zeros (masked)
            value = trial % 5 == 4 && row % 3 == 0 ? 0.0f : std::exp2(-12.0f * uniform(random));
        const WarpOperands operands = quantizeLikeTheKernel(p, scale_group, two_level);
        for (int row = 0; row < kRows; ++row) {
          std::vector<double> expected(p[row].begin(), p[row].end());
          reference::quantizeProbabilities(expected, probabilitySpec(scale_group, two_level));
          for (int k = 0; k < kChunk; ++k) {
            CAPTURE(row);
            CAPTURE(k);
            CHECK(dequantized(operands, row, k, scale_group) == expected[k]);
          }
        }
      }
    }
}
