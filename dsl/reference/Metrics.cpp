#include "sage/reference/Metrics.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace sage::reference {

AccuracyMetrics compareOutputs(std::span<const double> reference, std::span<const double> candidate) {
  if (reference.size() != candidate.size() || reference.empty())
    throw std::invalid_argument("compareOutputs: expected two non-empty outputs of the same size");
  double dot = 0.0, reference_norm = 0.0, candidate_norm = 0.0, abs_error = 0.0, abs_reference = 0.0, sq_error = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double o = reference[i], o_prime = candidate[i];
    if (!std::isfinite(o) || !std::isfinite(o_prime)) {
      const double nan = std::numeric_limits<double>::quiet_NaN();
      return {nan, nan, nan};
    }
    dot += o * o_prime;
    reference_norm += o * o;
    candidate_norm += o_prime * o_prime;
    abs_error += std::fabs(o - o_prime);
    abs_reference += std::fabs(o);
    sq_error += (o - o_prime) * (o - o_prime);
  }
  AccuracyMetrics metrics;
  const double norms = std::sqrt(reference_norm) * std::sqrt(candidate_norm);
  metrics.cosine_similarity = norms > 0.0 ? dot / norms : (reference_norm == candidate_norm ? 1.0 : 0.0);
  metrics.relative_l1 = abs_reference > 0.0 ? abs_error / abs_reference : abs_error;
  metrics.rmse = std::sqrt(sq_error / static_cast<double>(reference.size()));
  return metrics;
}

} // namespace sage::reference
