// Whole-program rules of sage.attention: the steps every variant must have, exactly once.
#include "Dataflow.h"
#include "SlaVerifier.h"
#include "VerifierSupport.h"
#include "sage/ir/Dialect.h"
#include "sage/numerics/Hadamard.h"

#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <string>

namespace sage::ir {
namespace {

using dataflow::Origin;
using detail::opsOf;

// The randomized Hadamard rotation (issue 28), every rule in one place: it is a property of Q.K^T, so it lies on Q's
// and K's quantizers with one seed, or on neither; it needs a head_dim whose Hadamard matrix exists.
mlir::LogicalResult verifyRotation(AttentionOp attention, mlir::Block &body) {
  std::optional<int64_t> q_seed, k_seed;
  QuantizeOp first;
  for (QuantizeOp quantize : opsOf<QuantizeOp>(body)) {
    const mlir::IntegerAttr seed = quantize.getRotationSeedAttr();
    const Origin origin = dataflow::originOf(quantize.getInput());
    if (origin == Origin::q || origin == Origin::k)
      (origin == Origin::q ? q_seed : k_seed) = seed ? std::optional<int64_t>(seed.getInt()) : std::nullopt;
    if (!seed)
      continue;
    first = first ? first : quantize;
    if (origin != Origin::q && origin != Origin::k)
      return quantize.emitOpError() << "rotation_seed rotates the operands of Q.K^T along head_dim (their rotations "
                                       "cancel in the product); "
                                    << dataflow::originName(origin) << " cannot be rotated";
    if (seed.getInt() < 0 || seed.getInt() > int64_t{UINT32_MAX})
      return quantize.emitOpError() << "rotation_seed must lie in [0, 2^32 - 1], got " << seed.getInt();
    if (quantize.getGranularity() == Granularity::none)
      return quantize.emitOpError() << "rotation_seed spreads outlier channels over a quantizer's groups; a cast to "
                                    << stringifyElementType(quantize.getDtype())
                                    << " has no scale to protect, and rotating it would only add rounding";
  }
  if (!first)
    return mlir::success();
  if (q_seed != k_seed) {
    auto seedText = [](std::optional<int64_t> seed) { return seed ? std::to_string(*seed) : std::string("none"); };
    return first.emitOpError() << "Q and K must be rotated with the same seed, or neither (Q R (K R)^T = Q K^T "
                                  "needs the same R on both sides): Q's rotation_seed is "
                               << seedText(q_seed) << ", K's " << seedText(k_seed);
  }
  const int64_t head_dim = attention.getHeadDimAttr().getInt();
  if (!numerics::isHadamardDim(head_dim))
    return first.emitOpError() << "rotation_seed needs a Sylvester-Hadamard matrix of order head_dim, which exists "
                                  "for powers of two; head_dim must be a power of two in ["
                               << numerics::kMinHadamardDim << ", " << numerics::kMaxHadamardDim << "], got "
                               << head_dim;
  return mlir::success();
}

// Packed sequences (issue 28): what cannot run on them is one rule of the vocabulary (packedSequencesProblem), which
// packedSequencesOf applies to a variant and this to a program.
mlir::LogicalResult verifyPackedSequences(AttentionOp attention, mlir::Block &body) {
  if (!attention.getPackedSequences())
    return mlir::success();
  sage::MaskKind mask = sage::MaskKind::none;
  if (auto masks = opsOf<MaskOp>(body); !masks.empty())
    mask = sage::parseMaskKind(stringifyMaskKind(masks.front().getKind()).str()).value_or(sage::MaskKind::none);
  const std::string problem = sage::packedSequencesProblem(mask, !opsOf<PredictMaskOp>(body).empty());
  if (!problem.empty())
    return attention.emitOpError() << problem;
  return mlir::success();
}

} // namespace

mlir::LogicalResult AttentionOp::verifyRegions() {
  mlir::Block &body = getBody().front();
  for (mlir::Operation &op : body)
    if (op.getDialect() != (*this)->getDialect())
      return op.emitOpError() << "is not a sage op; a sage.attention body holds only sage ops";

  auto inputs = opsOf<InputOp>(body);
  for (TensorRole role : {TensorRole::q, TensorRole::k, TensorRole::v}) {
    int count = 0;
    for (InputOp input : inputs)
      count += input.getRole() == role ? 1 : 0;
    if (count != 1)
      return emitOpError() << "expects exactly one 'sage.input " << stringifyTensorRole(role) << "', found " << count;
  }

  int smooth_counts[3] = {0, 0, 0};
  for (SmoothOp smooth : opsOf<SmoothOp>(body)) {
    Origin origin = dataflow::originOf(smooth.getInput());
    int index = origin == Origin::q ? 0 : origin == Origin::k ? 1 : 2;
    if (++smooth_counts[index] > 1)
      return smooth.emitOpError() << "smooths " << dataflow::originName(origin) << " a second time";
  }

  // Q smoothing subtracts each block's mean before the mma; the GEMV adds mean . K^T back (exactly one of each).
  auto corrections = opsOf<QMeanCorrectionOp>(body);
  if (smooth_counts[0] == 1 && corrections.size() != 1)
    return emitOpError() << "Q is smoothed, so S needs exactly one 'sage.q_mean_correction' (S += mean(Q_i) . "
                            "K^T), found "
                         << corrections.size();
  if (smooth_counts[0] == 0 && !corrections.empty())
    return corrections.front().emitOpError() << "Q is not smoothed: there is no block mean to add back";

  auto mmas = opsOf<MmaOp>(body);
  int qk_count = 0, pv_count = 0;
  for (MmaOp mma : mmas)
    (dataflow::originOf(mma.getResult()) == Origin::scores ? qk_count : pv_count)++;
  if (qk_count != 1 || pv_count != 1)
    return emitOpError() << "expects one Q.K^T mma and one P.V mma, found " << qk_count << " and " << pv_count;

  if (opsOf<MaskOp>(body).size() > 1)
    return emitOpError() << "expects at most one sage.mask";
  auto softmaxes = opsOf<OnlineSoftmaxOp>(body);
  if (softmaxes.size() != 1)
    return emitOpError() << "expects exactly one sage.online_softmax";
  for (QuantizeOp quantize : opsOf<QuantizeOp>(body))
    if (quantize.getFoldSoftmaxScale() && softmaxes.front().getBase() != SoftmaxBase::exp2)
      return quantize.emitOpError() << "fold_softmax_scale folds log2(e) into Q for the exp2 softmax, but the "
                                       "softmax uses exp";
  if (mlir::failed(verifyRotation(*this, body)))
    return mlir::failure();
  if (opsOf<AccumulateOp>(body).size() != 1)
    return emitOpError() << "expects exactly one sage.accumulate";

  auto writes = opsOf<WriteOOp>(body);
  if (writes.empty())
    return emitOpError() << "has no epilogue: expected a 'sage.write_o' of the normalized output";
  if (writes.size() > 1)
    return emitOpError() << "writes O " << writes.size() << " times; expected one 'sage.write_o'";

  auto lse_writes = opsOf<WriteLseOp>(body);
  if (lse_writes.size() > 1)
    return emitOpError() << "expects at most one sage.write_lse";
  if (!lse_writes.empty()) {
    bool k_smoothed = smooth_counts[1] == 1;
    bool corrected = lse_writes.front().getSmoothingCorrection();
    if (k_smoothed && !corrected)
      return lse_writes.front().emitOpError()
             << "K is smoothed, so the LSE must add q.mean(K) back: set smoothing_correction";
    if (!k_smoothed && corrected)
      return lse_writes.front().emitOpError() << "smoothing_correction is set but K is not smoothed";
  }
  if (mlir::failed(verifySlaProgram(*this, body)))
    return mlir::failure();
  if (mlir::failed(verifyPackedSequences(*this, body)))
    return mlir::failure();

  // The variant is read from the ops themselves (Extract.cpp), so a step nothing uses would still describe it: an
  // unused quantizer of K would set K's type, an unused smoothing of V the epilogue's mean(V) (issue 26).
  for (mlir::Operation &op : body)
    for (mlir::Value result : op.getResults())
      if (result.use_empty())
        return op.emitOpError() << "computes a value nothing uses: every step of a sage program feeds its output "
                                   "(an unused step would still change the variant)";
  return mlir::success();
}

} // namespace sage::ir
