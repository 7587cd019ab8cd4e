#include "PvAccumulator.h"

#include "sage/numerics/Quantizers.h"

#include <algorithm>

namespace sage::reference {

PvAccumulator::PvAccumulator(const AccumulationSpec &spec, int64_t rows, int64_t dim)
    : spec_(spec), dim_(dim),
      // mma.m16n8k16 (f16) adds 16 products per step; the FP8 mma.m16n8k32 adds 32.
      chunk_tokens_(spec.kind == AccumulationKind::f32_two_level ? 32 : 16),
      inner_(static_cast<size_t>(rows * dim), 0.0), outer_(static_cast<size_t>(rows * dim), 0.0) {}

double PvAccumulator::roundInner(double value) const {
  switch (spec_.kind) {
  case AccumulationKind::f16:
  case AccumulationKind::f16_then_f32:
    return numerics::roundToHalf(value);
  case AccumulationKind::f32_two_level:
    return static_cast<float>(value);
  case AccumulationKind::f32:
    break;
  }
  return value; // f32 accumulation is modelled exactly (double)
}

void PvAccumulator::accumulateRow(int64_t row, double alpha, const std::vector<double> &probabilities,
                                  const double *values) {
  const int64_t columns = static_cast<int64_t>(probabilities.size());
  double *inner = &inner_[row * dim_];
  double *outer = &outer_[row * dim_];
  for (int64_t c = 0; c < dim_; ++c) {
    outer[c] *= alpha;
    double accumulator = roundInner(inner[c] * alpha);
    for (int64_t begin = 0; begin < columns; begin += chunk_tokens_) {
      double chunk = 0.0;
      for (int64_t j = begin; j < std::min(columns, begin + chunk_tokens_); ++j)
        chunk += probabilities[j] * values[j * dim_ + c];
      accumulator = roundInner(accumulator + chunk);
    }
    inner[c] = accumulator;
  }
}

void PvAccumulator::endBlock() {
  bool two_level = spec_.kind == AccumulationKind::f16_then_f32 || spec_.kind == AccumulationKind::f32_two_level;
  if (!two_level || ++blocks_since_flush_ < spec_.flush_period)
    return;
  for (size_t i = 0; i < inner_.size(); ++i) {
    outer_[i] += inner_[i];
    inner_[i] = 0.0;
  }
  blocks_since_flush_ = 0;
}

std::vector<double> PvAccumulator::finish() {
  std::vector<double> total(inner_.size());
  for (size_t i = 0; i < inner_.size(); ++i)
    total[i] = outer_[i] + inner_[i];
  return total;
}

} // namespace sage::reference
