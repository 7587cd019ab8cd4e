// The largest magnitude of a vector and the largest element-wise difference of two: what the backward and SLA
// reference tests bound.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace sage::reference_test {

inline double maxAbs(const std::vector<double> &values) {
  double result = 0.0;
  for (double value : values)
    result = std::max(result, std::fabs(value));
  return result;
}

// Requires equal sizes.
inline double maxAbsDifference(const std::vector<double> &a, const std::vector<double> &b) {
  REQUIRE(a.size() == b.size());
  double result = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    result = std::max(result, std::fabs(a[i] - b[i]));
  return result;
}

} // namespace sage::reference_test
