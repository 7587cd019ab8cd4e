// The randomized Hadamard rotation (sage/numerics/Hadamard.h): the matrix it multiplies by, that R_Q R_K^T is the
// identity exactly, and its fixed sign generator.
#include "sage/numerics/Hadamard.h"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace sage::numerics;

namespace {

// Entry (r, c) of the Sylvester-Hadamard matrix: (-1)^popcount(r & c).
int hadamardEntry(int r, int c) { return std::popcount(static_cast<unsigned>(r & c)) % 2 == 0 ? 1 : -1; }

std::vector<float> rotated(std::vector<float> x, uint32_t seed, bool for_k) {
  hadamardRotate(x, seed, for_k);
  return x;
}

} // namespace

TEST_CASE("the rotation is x H D 2^-e, exactly on small integers") {
  for (int d : {16, 32, 64, 128, 256})
    for (bool for_k : {false, true}) {
      CAPTURE(d);
      CAPTURE(for_k);
      std::vector<float> x(static_cast<size_t>(d));
      for (int c = 0; c < d; ++c)
        x[c] = static_cast<float>((c * 37 + 11) % 23 - 11); // integers: every butterfly sum is exact in f32
      const std::vector<float> y = rotated(x, 99, for_k);
      const double scale = std::ldexp(1.0, -hadamardScaleExponent(d, for_k));
      for (int c = 0; c < d; ++c) {
        double expected = 0.0;
        for (int r = 0; r < d; ++r)
          expected += static_cast<double>(x[r]) * hadamardEntry(r, c);
        expected *= (hadamardNegates(99, c) ? -scale : scale);
        CHECK(static_cast<double>(y[c]) == expected);
      }
    }
}

TEST_CASE("R_Q R_K^T is the identity, exactly: Q's and K's rotations cancel in Q.K^T") {
  for (int d : {16, 64, 128, 256}) {
    CAPTURE(d);
    CHECK(hadamardScaleExponent(d, false) + hadamardScaleExponent(d, true) == std::countr_zero(unsigned(d)));
    std::vector<std::vector<float>> q_rows, k_rows;
    for (int i = 0; i < d; ++i) {
      std::vector<float> unit(static_cast<size_t>(d), 0.0f);
      unit[i] = 1.0f;
      q_rows.push_back(rotated(unit, 5, false));
      k_rows.push_back(rotated(unit, 5, true));
    }
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) {
        double dot = 0.0;
        for (int c = 0; c < d; ++c)
          dot += static_cast<double>(q_rows[i][c]) * k_rows[j][c];
        if (dot != (i == j ? 1.0 : 0.0))
          FAIL_CHECK("(R_Q R_K^T)[" << i << "][" << j << "] = " << dot);
      }
  }
}

TEST_CASE("an outlier channel is spread over every channel") {
  std::vector<float> x(128, 0.0f);
  x[17] = 20.0f;
  for (float value : rotated(x, 0, false))
    CHECK(std::fabs(value) == doctest::Approx(20.0 / 8.0)); // |20 * (+-1) / 8| in every channel
}

TEST_CASE("the signs come from SplitMix64 and depend on the seed") {
  CHECK(hadamardSigns(0)[0] == 0xE220A8397B1DCDAFull); // SplitMix64's first output from state 0
  CHECK(hadamardSigns(1)[0] != hadamardSigns(0)[0]);
  int negated = 0;
  for (int c = 0; c < 256; ++c)
    negated += hadamardNegates(7, c) ? 1 : 0;
  CHECK(negated > 96); // about half: a fixed seed's count, far from all or none
  CHECK(negated < 160);
}

TEST_CASE("only powers of two from 16 to 256 have a rotation") {
  CHECK(isHadamardDim(64));
  CHECK(isHadamardDim(128));
  CHECK_FALSE(isHadamardDim(96));
  CHECK_FALSE(isHadamardDim(8));
  CHECK_FALSE(isHadamardDim(512));
  std::vector<float> x(80, 1.0f);
  CHECK_THROWS_AS(hadamardRotate(x, 0, false), std::invalid_argument);
}
