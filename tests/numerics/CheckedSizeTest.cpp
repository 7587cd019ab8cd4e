// Checked products of user-given sizes (sage/numerics/CheckedSize.h).
#include "sage/numerics/CheckedSize.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

using sage::numerics::checkedProduct;
using sage::numerics::productAtMost;

TEST_CASE("products that fit are exact") {
  CHECK(checkedProduct({}) == 1);
  CHECK(checkedProduct({2, 3, 7}) == 42);
  CHECK(checkedProduct({int64_t(1) << 31, int64_t(1) << 31}) == int64_t(1) << 62);
  CHECK(checkedProduct({std::numeric_limits<int64_t>::max(), 1}) == std::numeric_limits<int64_t>::max());
  CHECK(checkedProduct({0, std::numeric_limits<int64_t>::max(), 5}) == 0);
}

TEST_CASE("an overflowing or negative product is nothing, never a wrapped value") {
  // The issue's `reference --n 144115188075855872 --heads 1`: 2^57 tokens x 128 channels = 2^64.
  CHECK_FALSE(checkedProduct({int64_t(1) << 57, 128}).has_value());
  CHECK_FALSE(checkedProduct({int64_t(1) << 32, int64_t(1) << 32, 16}).has_value());
  CHECK_FALSE(checkedProduct({std::numeric_limits<int64_t>::max(), 2}).has_value());
  CHECK_FALSE(checkedProduct({4, -7}).has_value());
  CHECK_FALSE(checkedProduct({-1, -1}).has_value()); // a positive product of negatives is still refused
}

TEST_CASE("productAtMost names what and the limit") {
  CHECK(productAtMost({4, 8}, 32, "x") == 32);
  CHECK_THROWS_WITH_AS(productAtMost({4, 9}, 32, "tile"), "tile: 4 x 9 = 36 exceeds the limit of 32",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(productAtMost({int64_t(1) << 40, int64_t(1) << 40}, 32, "tile"),
                       "tile: 1099511627776 x 1099511627776 exceeds the limit of 32", std::invalid_argument);
}
