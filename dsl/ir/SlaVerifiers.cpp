// Verifiers of SLA's ops (SlaOps.td) and the whole-program rules of an SLA program (issue 13).
#include "Dataflow.h"
#include "SlaVerifier.h"
#include "VerifierSupport.h"
#include "sage/ir/Dialect.h"

#include "llvm/ADT/SmallVector.h"

namespace sage::ir {
namespace {

using detail::opsOf;

// SLA reads the caller's tensors: pooling, phi(Q), phi(K) and V of the linear branch see no smoothing or quantizer.
bool isInputOf(mlir::Value value, TensorRole role) {
  auto input = value.getDefiningOp<InputOp>();
  return input && input.getRole() == role;
}

} // namespace

mlir::LogicalResult PredictMaskOp::verify() {
  if (!isInputOf(getQ(), TensorRole::q) || !isInputOf(getK(), TensorRole::k))
    return emitOpError() << "pools the caller's Q and K: its operands must be 'sage.input q' and 'sage.input k'";
  const double critical = getCriticalPercent().convertToDouble();
  const double negligible = getNegligiblePercent().convertToDouble();
  if (!(critical > 0.0 && critical <= 100.0))
    return emitOpError() << "critical_percent (k_h) must lie in (0, 100], got " << critical;
  if (!(negligible >= 0.0 && negligible < 100.0))
    return emitOpError() << "negligible_percent (k_l) must lie in [0, 100), got " << negligible;
  if (!(critical + negligible <= 100.0))
    return emitOpError() << "critical_percent + negligible_percent must be at most 100, got " << critical << " + "
                         << negligible;
  return mlir::success();
}

mlir::LogicalResult LinearBranchOp::verify() {
  if (!isInputOf(getQ(), TensorRole::q) || !isInputOf(getK(), TensorRole::k) || !isInputOf(getV(), TensorRole::v))
    return emitOpError() << "runs on the caller's Q, K and V: its first three operands must be 'sage.input q', "
                            "'sage.input k' and 'sage.input v'";
  if (!mlir::isa_and_nonnull<PredictMaskOp>(dataflow::earlierProducer(getClasses(), *this)))
    return emitOpError() << "sums over the marginal blocks of M_c: its fourth operand must come from "
                            "sage.predict_mask";
  return mlir::success();
}

mlir::LogicalResult SlaCombineOp::verify() {
  if (!mlir::isa_and_nonnull<NormalizeOp>(dataflow::earlierProducer(getSparse(), *this)))
    return emitOpError() << "adds the sparse part's normalized O^s: its first operand must come from sage.normalize";
  if (!mlir::isa_and_nonnull<LinearBranchOp>(dataflow::earlierProducer(getLinear(), *this)))
    return emitOpError() << "projects the linear branch's O^l: its second operand must come from "
                            "sage.linear_branch";
  return mlir::success();
}

mlir::LogicalResult verifySlaProgram(AttentionOp attention, mlir::Block &body) {
  auto predictions = opsOf<PredictMaskOp>(body);
  auto branches = opsOf<LinearBranchOp>(body);
  auto combines = opsOf<SlaCombineOp>(body);
  if (predictions.empty() && branches.empty() && combines.empty())
    return mlir::success();
  if (predictions.size() != 1 || branches.size() != 1 || combines.size() != 1)
    return attention.emitOpError() << "an SLA program has exactly one sage.predict_mask, sage.linear_branch and "
                                      "sage.sla_combine each, found "
                                   << predictions.size() << ", " << branches.size() << " and " << combines.size();
  auto masks = opsOf<MaskOp>(body);
  if (masks.size() != 1 || masks.front().getKind() != MaskKind::block_sparse)
    return attention.emitOpError() << "SLA computes its critical blocks exactly: the scores need one "
                                      "'sage.mask ... block_sparse' (the blocks sage.predict_mask marks critical)";
  for (WriteOOp write : opsOf<WriteOOp>(body))
    if (!mlir::isa_and_nonnull<SlaCombineOp>(dataflow::earlierProducer(write.getInput(), write)))
      return write.emitOpError() << "an SLA program writes O = O^s + Proj(O^l): its operand must come from "
                                    "sage.sla_combine";
  return mlir::success();
}

} // namespace sage::ir
