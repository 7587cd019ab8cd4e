// Names and per-row class counts of SLA's vocabulary (sage/ir/SlaSpec.h).
#include "sage/ir/SlaSpec.h"

#include <algorithm>
#include <cmath>

namespace sage {
namespace {

// Relative slack for percent * blocks: decimal percentages are not exact in binary.
constexpr double kCountSlack = 1e-9;

// A percentage in [0, 100] (NaN as 0), so the count below converts a bounded value to an integer.
double boundedFraction(double percent) { return (percent >= 0.0 ? std::min(percent, 100.0) : 0.0) / 100.0; }

} // namespace

std::string_view nameOf(FeatureMap map) {
  switch (map) {
  case FeatureMap::softmax:
    return "softmax";
  case FeatureMap::elu_plus_one:
    return "elu_plus_one";
  case FeatureMap::relu:
    return "relu";
  }
  return "<invalid>";
}

std::optional<FeatureMap> parseFeatureMap(std::string_view text) {
  for (FeatureMap map : {FeatureMap::softmax, FeatureMap::elu_plus_one, FeatureMap::relu})
    if (nameOf(map) == text)
      return map;
  return std::nullopt;
}

int64_t criticalBlocksPerRow(const SlaSpec &spec, int64_t kv_blocks) {
  const double exact = boundedFraction(spec.critical_percent) * static_cast<double>(kv_blocks);
  const auto count = static_cast<int64_t>(std::ceil(exact * (1.0 - kCountSlack)));
  return std::clamp<int64_t>(count, 1, kv_blocks);
}

int64_t negligibleBlocksPerRow(const SlaSpec &spec, int64_t kv_blocks) {
  const double exact = boundedFraction(spec.negligible_percent) * static_cast<double>(kv_blocks);
  const auto count = static_cast<int64_t>(std::floor(exact * (1.0 + kCountSlack)));
  return std::clamp<int64_t>(count, 0, kv_blocks - criticalBlocksPerRow(spec, kv_blocks));
}

} // namespace sage
