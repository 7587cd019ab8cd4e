#include "BackwardDataflow.h"

#include "Dataflow.h"

#include <iterator>

namespace sage::ir::backward {

const char *originName(Origin origin) {
  // In the order of Origin's enumerators, up to unknown.
  static constexpr const char *kNames[] = {"Q", "K",  "V", "O",  "the LSE", "dO", "the scores S",
                                           "P", "dP", "D", "dS", "dV",      "dQ", "dK"};
  static_assert(std::size(kNames) == static_cast<size_t>(Origin::unknown));
  return dataflow::originNameIn(kNames, origin);
}

namespace {

Origin originOfProducer(mlir::Operation *producer);

Origin originThrough(mlir::Value operand, mlir::Operation *user) {
  return originOfProducer(dataflow::earlierProducer(operand, user));
}

Origin originOfRole(BackwardRole role) {
  switch (role) {
  case BackwardRole::q:
    return Origin::q;
  case BackwardRole::k:
    return Origin::k;
  case BackwardRole::v:
    return Origin::v;
  case BackwardRole::o:
    return Origin::o;
  case BackwardRole::lse:
    return Origin::lse;
  case BackwardRole::d_o:
    return Origin::d_o;
  }
  return Origin::unknown;
}

Origin originOfProducer(mlir::Operation *producer) {
  if (!producer)
    return Origin::unknown;
  if (auto input = mlir::dyn_cast<BwdInputOp>(producer))
    return originOfRole(input.getRole());
  if (auto quantize = mlir::dyn_cast<BwdQuantizeOp>(producer))
    return originThrough(quantize.getInput(), producer);
  if (auto mask = mlir::dyn_cast<BwdMaskOp>(producer))
    return originThrough(mask.getInput(), producer);
  if (auto smooth = mlir::dyn_cast<BwdSmoothOp>(producer)) // K - mean(K) is still K
    return originThrough(smooth.getInput(), producer);
  if (auto mma = mlir::dyn_cast<BwdMmaOp>(producer)) {
    std::optional<BackwardProduct> product = productOf(mma);
    return product ? resultOrigin(*product) : Origin::unknown;
  }
  if (mlir::isa<BwdRecomputePOp>(producer))
    return Origin::p;
  if (mlir::isa<BwdRowDotOp>(producer))
    return Origin::delta;
  if (mlir::isa<BwdDsOp>(producer))
    return Origin::ds;
  return Origin::unknown;
}

} // namespace

Origin originOf(mlir::Value value) { return originOfProducer(value.getDefiningOp()); }

std::optional<BackwardProduct> productOf(Origin lhs, Origin rhs) {
  if (lhs == Origin::q && rhs == Origin::k)
    return BackwardProduct::s;
  if (lhs == Origin::d_o && rhs == Origin::v)
    return BackwardProduct::dp;
  if (lhs == Origin::p && rhs == Origin::d_o)
    return BackwardProduct::dv;
  if (lhs == Origin::ds && rhs == Origin::k)
    return BackwardProduct::dq;
  if (lhs == Origin::ds && rhs == Origin::q)
    return BackwardProduct::dk;
  return std::nullopt;
}

Origin resultOrigin(BackwardProduct product) {
  switch (product) {
  case BackwardProduct::s:
    return Origin::s;
  case BackwardProduct::dp:
    return Origin::dp;
  case BackwardProduct::dv:
    return Origin::dv;
  case BackwardProduct::dq:
    return Origin::dq;
  case BackwardProduct::dk:
    return Origin::dk;
  }
  return Origin::unknown;
}

std::optional<BackwardProduct> productOf(BwdMmaOp mma) {
  mlir::Operation *op = mma.getOperation();
  return productOf(originThrough(mma.getLhs(), op), originThrough(mma.getRhs(), op));
}

} // namespace sage::ir::backward
