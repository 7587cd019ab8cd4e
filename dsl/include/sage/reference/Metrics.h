// The paper's accuracy metrics (section 4.3) between a result O' and the full-precision O.
#pragma once

#include <span>

namespace sage::reference {

struct AccuracyMetrics {
  double cosine_similarity = 0.0; // sum(O O') / sqrt(sum O^2) / sqrt(sum O'^2)
  double relative_l1 = 0.0;       // sum |O - O'| / sum |O|
  double rmse = 0.0;              // sqrt(mean (O - O')^2)
};

// Non-finite values make every metric NaN (so a bound check fails loudly).
AccuracyMetrics compareOutputs(std::span<const double> reference, std::span<const double> candidate);

} // namespace sage::reference
