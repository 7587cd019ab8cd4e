// What the backward and SLA reference tests share: the largest magnitude of a vector and the largest element-wise
// difference of two (what they bound), and K with per-channel offsets (what K smoothing removes).
#pragma once

#include "sage/reference/HostTensor.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

// K [1, heads, tokens, dim] with a per-channel offset of stddev `bias` drawn for each head (the offsets of real
// models differ between heads: K smoothing takes one mean per KV head), N(0, 1) around it.
inline reference::HostTensor keysWithOffsets(int64_t heads, int64_t tokens, int64_t dim, reference::StorageType storage,
                                             uint64_t seed, double bias) {
  using reference::Layout;
  reference::HostTensor k(1, heads, tokens, dim, storage, Layout::hnd);
  for (int64_t h = 0; h < heads; ++h) {
    const reference::HostTensor head = reference::randomTensor(
        1, 1, tokens, dim, storage, Layout::hnd, {seed + static_cast<uint64_t>(h) * 7919, 0.0, 1.0, bias});
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < dim; ++c)
        k.set(0, h, t, c, head.at(0, 0, t, c));
  }
  return k;
}

} // namespace sage::reference_test
