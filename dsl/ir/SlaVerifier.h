// Whole-program rules of an SLA program (SlaVerifiers.cpp), called by sage.attention's region verifier.
#pragma once

#include "sage/ir/Dialect.h"

namespace sage::ir {

// Succeeds for programs without SLA ops; otherwise checks one predict_mask / linear_branch / sla_combine, a
// block_sparse mask on the scores, and that O is written from sla_combine.
mlir::LogicalResult verifySlaProgram(AttentionOp attention, mlir::Block &body);

} // namespace sage::ir
