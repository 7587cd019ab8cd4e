// Rules every sage op obeys, checked as traits so they run before the op's own verifier: that verifier walks the
// dataflow, which must not meet a value used before (or in) its own definition, and must not see attributes the op
// does not know.
#pragma once

#include "mlir/IR/OpDefinition.h"

namespace sage::ir {

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

} // namespace sage::ir
