// Where a tile comes from: the verifiers and the extraction both ask "is this Q, K, V, P or the
// scores?" by walking producers back through smoothing and quantization.
#pragma once

#include "sage/ir/Dialect.h"

#include <cstddef>

namespace sage::ir::dataflow {

enum class Origin { q, k, v, p, scores, output, unknown };

const char *originName(Origin origin);

// names[origin], `fallback` past the end: an origin's name or keyword from its enum's table (Origin here, in
// BackwardDataflow.h backward::Origin).
template <typename OriginType, size_t N>
const char *originNameIn(const char *const (&names)[N], OriginType origin, const char *fallback = "an unknown value") {
  const auto index = static_cast<size_t>(origin);
  return index < N ? names[index] : fallback;
}

// The op defining `value` when it lies earlier than `user` in the same block, else null. The walks below step only
// to earlier ops, so they end even on a program with a cycle or a use before a definition: the op verifiers that
// call them run before MLIR's dominance check.
mlir::Operation *earlierProducer(mlir::Value value, mlir::Operation *user);

// Every walk takes at most this many steps (issue 26). The op verifiers keep each chain of a valid program shorter (at
// most one sage.mask; a quantizer reads sage.input, sage.smooth or the softmax, never another quantizer or decode;
// the longest is mask -> q_mean_correction -> dequant -> mma -> decode -> quantize -> smooth -> input), so the bound
// changes no valid program's meaning; it makes each walk O(1), and verifying a program linear in its length whatever
// the text holds (16,000 chained casts took 4 s to verify when every op walked the whole chain).
inline constexpr int kMaxWalkSteps = 16;

// Q/K/V for values derived from sage.input through smooth/quantize; P for values derived from the
// softmax; scores for the Q.K^T mma and what follows it up to the softmax; output for P.V and after.
Origin originOf(mlir::Value value);

// The sage.quantize that produced `value` (directly or through a sage.decode), or null.
QuantizeOp quantizerOf(mlir::Value value);

// The element type an mma operand arrives in: the sage.decode's dtype, else its quantizer's. Requires
// quantizerOf(value).
ElementType operandType(mlir::Value value);

// The sage.mma whose result feeds `value` through dequant/q_mean_correction/mask, or null.
MmaOp mmaBehind(mlir::Value value);

// Whether an operand of the mma carries scales that a sage.dequant must apply.
bool operandsCarryScales(MmaOp mma);

} // namespace sage::ir::dataflow
