#include "sage/ir/OpTraits.h"

#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Operation.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/raw_ostream.h"

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

mlir::LogicalResult verifyProgramName(mlir::Operation *op) {
  auto name = op->getAttrOfType<mlir::StringAttr>(mlir::SymbolTable::getSymbolAttrName());
  if (!name)
    return mlir::success();
  const llvm::StringRef text = name.getValue();
  const bool valid = !text.empty() && text.size() <= kMaxProgramNameLength &&
                     llvm::all_of(text, [](char c) { return llvm::isAlnum(c) || c == '_' || c == '.' || c == '-'; });
  if (valid)
    return mlir::success();
  std::string shown; // the name as an escaped string: it may hold newlines or terminal controls
  llvm::raw_string_ostream stream(shown);
  llvm::printEscapedString(text.take_front(kMaxProgramNameLength), stream);
  return op->emitOpError()
         << "name \"" << shown << (text.size() > kMaxProgramNameLength ? "\"..." : "\"") << " (" << text.size()
         << " bytes): a program's name is 1 to " << kMaxProgramNameLength
         << " letters, digits, '_', '.' or '-' (it becomes part of kernel names and generated source)";
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
