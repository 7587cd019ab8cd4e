// The paper's metrics on hand-computed vectors.
#include "sage/reference/Metrics.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

using sage::reference::compareOutputs;

TEST_CASE("metrics of hand-computed vectors") {
  const std::vector<double> o{1.0, -2.0, 2.0};       // |O| sums to 5, |O|^2 = 9
  const std::vector<double> o_prime{1.0, -2.0, 1.0}; // error 1 in one element
  const auto metrics = compareOutputs(o, o_prime);
  // cos = (1 + 4 + 2) / (3 * sqrt(6)); rel-L1 = 1 / 5; RMSE = sqrt(1 / 3)
  CHECK(metrics.cosine_similarity == doctest::Approx(7.0 / (3.0 * std::sqrt(6.0))));
  CHECK(metrics.relative_l1 == doctest::Approx(0.2));
  CHECK(metrics.rmse == doctest::Approx(std::sqrt(1.0 / 3.0)));
  const auto same = compareOutputs(o, o);
  CHECK(same.cosine_similarity == doctest::Approx(1.0));
  CHECK(same.relative_l1 == 0.0);
}

TEST_CASE("non-finite values poison every metric") {
  const std::vector<double> o{1.0, 2.0};
  const std::vector<double> bad{1.0, std::numeric_limits<double>::quiet_NaN()};
  CHECK(std::isnan(compareOutputs(o, bad).cosine_similarity));
  CHECK_THROWS_AS(compareOutputs(o, std::vector<double>{1.0}), std::invalid_argument);
}
