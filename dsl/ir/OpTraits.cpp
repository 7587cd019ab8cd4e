#include "sage/ir/OpTraits.h"

#include "mlir/IR/Operation.h"

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
  auto unknown = op->getDiscardableAttrs(); // with properties, the op's own attributes are not in this list
  if (unknown.begin() == unknown.end())
    return mlir::success();
  std::string known;
  for (mlir::StringAttr name : op->getName().getAttributeNames())
    known += (known.empty() ? "" : ", ") + name.str();
  return op->emitOpError() << "unknown attribute '" << (*unknown.begin()).getName().getValue() << "'; expected "
                           << (known.empty() ? std::string("none") : known);
}

} // namespace sage::ir
