// Rules every sage op obeys, checked as traits so they run before the op's own verifier: that verifier walks the
// dataflow, which must not meet a value used before (or in) its own definition, and must not see attributes the op
// does not know.
#pragma once

#include "mlir/IR/OpDefinition.h"

#include <cstddef>

namespace sage::ir {

// A program's symbol name (sym_name) is 1 to kMaxProgramNameLength letters, digits, '_', '.' or '-': it becomes part
// of kernel names and is written into generated source (issue 26: a newline in it injected lines). Ops without a
// sym_name pass.
inline constexpr size_t kMaxProgramNameLength = 64;
mlir::LogicalResult verifyProgramName(mlir::Operation *op);
// Every operand is the result of an earlier op of the same block (MLIR's dominance check runs after the op
// verifiers; without this a cycle through operands would send their dataflow walks round forever).
mlir::LogicalResult verifyOperandsDefinedEarlier(mlir::Operation *op);
// The op carries no attribute besides its own: a misspelled or unknown one is an error, not silently kept.
mlir::LogicalResult verifyOnlyKnownAttributes(mlir::Operation *op);

template <typename ConcreteType>
class OperandsDefinedEarlier : public mlir::OpTrait::TraitBase<ConcreteType, OperandsDefinedEarlier> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) { return verifyOperandsDefinedEarlier(op); }
};

template <typename ConcreteType>
class OnlyKnownAttributes : public mlir::OpTrait::TraitBase<ConcreteType, OnlyKnownAttributes> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) { return verifyOnlyKnownAttributes(op); }
};

template <typename ConcreteType> class ProgramName : public mlir::OpTrait::TraitBase<ConcreteType, ProgramName> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) { return verifyProgramName(op); }
};

} // namespace sage::ir
