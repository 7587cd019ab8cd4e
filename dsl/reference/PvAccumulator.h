// The O accumulator of one Q tile, modelled as the variant's AccumulationSpec says (see Reference.h).
#pragma once

#include "sage/ir/AttentionVariant.h"

#include <cstdint>
#include <vector>

namespace sage::reference {

class PvAccumulator {
public:
  PvAccumulator(const AccumulationSpec &spec, int64_t rows, int64_t dim);

  void beginBlock() {}
  // O_r = alpha * O_r + sum_j p_j V_j for one row; `values` holds the block's V rows, `dim` apart.
  void accumulateRow(int64_t row, double alpha, const std::vector<double> &probabilities, const double *values);
  void skipRow(int64_t /*row*/) {}
  void endBlock();              // counts KV blocks for the two-level flush
  std::vector<double> finish(); // the accumulated (unnormalized) O, [rows][dim]

private:
  double roundInner(double value) const;

  AccumulationSpec spec_;
  int64_t dim_;
  int64_t chunk_tokens_;      // tokens summed exactly before the accumulator rounds
  std::vector<double> inner_; // the mma's accumulator (f16, or f32 for f32_two_level; exact for f32)
  std::vector<double> outer_; // the f32 buffer of two-level accumulation
  int blocks_since_flush_ = 0;
};

} // namespace sage::reference
