// Quantizes one head's operand (a tokens x dim matrix) exactly as a QuantizerSpec says, and returns the
// dequantized values (code * scale, in double) that the reference multiplies.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/reference/HostTensor.h"

#include <cstdint>
#include <vector>

namespace sage::reference {

struct OperandMatrix {
  int64_t tokens = 0, dim = 0;
  std::vector<float> values; // row-major [tokens][dim], the f32 inputs of the quantizer
  float at(int64_t t, int64_t c) const { return values[t * dim + c]; }
};

// Head (b, h) of `tensor` as a tokens x dim matrix.
OperandMatrix headMatrix(const HostTensor &tensor, int64_t b, int64_t h);

// The sum of a[c] * b[c] over c < n, in double.
inline double dot(const double *a, const double *b, int64_t n) {
  double sum = 0.0;
  for (int64_t c = 0; c < n; ++c)
    sum += a[c] * b[c];
  return sum;
}

// `tile_tokens` is the tile the spec's groups live in (b_q for Q, b_kv for K; unused otherwise).
std::vector<double> quantizeOperand(const OperandMatrix &matrix, const QuantizerSpec &spec, int64_t tile_tokens);

// One row of P~ (values in [0, 1]) quantized as `spec` says (cast, static scale, per-token, two-level).
void quantizeProbabilities(std::vector<double> &row, const QuantizerSpec &spec);

// Smoothing (the forward's and the backward's): the mean over rows [begin, end) per channel, summed in double and
// rounded to f32 as a kernel holds it; and those rows minus it, one f32 subtraction per element.
// The randomized Hadamard rotation of every row (sage/numerics/Hadamard.h): R_K when `for_k`, else R_Q.
void rotateRows(OperandMatrix &matrix, uint32_t seed, bool for_k);

std::vector<float> channelMean(const OperandMatrix &matrix, int64_t begin, int64_t end);
void subtractRows(OperandMatrix &matrix, int64_t begin, int64_t end, const std::vector<float> &mean);

} // namespace sage::reference
