#include "sage/ir/OpTraits.h"

#include "mlir/IR/Operation.h"
#include "llvm/ADT/STLExtras.h"

#include <string>

namespace sage::ir {

mlir::LogicalResult verifyOperandsDefinedEarlier(mlir::Operation *op) {
  for (mlir::OpOperand &operand : op->getOpOperands()) {
    mlir::Operation *producer = operand.get().getDefiningOp();
    if (!producer || producer->getBlock() != op->getBlock() || producer == op || !producer->isBeforeInBlock(op))
      return op->emitOpError() << "operand #" << operand.getOperandNumber()
                               << " is used before (or in) its definition: every operand must be the result of an "
                                  "earlier op of the same sage.attention body";
  }
  return mlir::success();
}

mlir::LogicalResult verifyOnlyKnownAttributes(mlir::Operation *op) {
  for (mlir::NamedAttribute attribute : op->getDiscardableAttrs()) {
    std::string known;
    for (mlir::StringAttr name : op->getName().getAttributeNames())
      known += (known.empty() ? "" : ", ") + name.str();
    return op->emitOpError() << "unknown attribute '" << attribute.getName().getValue() << "'; expected "
                             << (known.empty() ? std::string("none") : known);
  }
  return mlir::success();
}

} // namespace sage::ir
