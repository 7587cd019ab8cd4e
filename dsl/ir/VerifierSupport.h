// Helpers shared by the op verifiers of the forward (OpVerifiers, ProgramVerifier, SlaVerifiers) and backward
// (BackwardVerifiers) programs.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/Dialect.h"

#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <utility>

namespace sage::ir::detail {

// ODS's getters of I64Attr return uint64_t, which turns -64 into 2^64 - 64: every integer attribute is read as the
// signed value it was written as, then range-checked.
inline int64_t signedValue(mlir::IntegerAttr attribute) { return attribute ? attribute.getInt() : 0; }

// f32, f16 and bf16: quantizers that cast instead of scaling.
inline bool isCast(ElementType type) {
  return type == ElementType::f32 || type == ElementType::f16 || type == ElementType::bf16;
}

// Every op of type OpType directly in `body`, in order.
template <typename OpType> llvm::SmallVector<OpType> opsOf(mlir::Block &body) {
  llvm::SmallVector<OpType> found;
  for (mlir::Operation &op : body)
    if (auto typed = mlir::dyn_cast<OpType>(op))
      found.push_back(typed);
  return found;
}

// The attributes every program op carries (sage.attention, sage.attention_backward): the IR version this sagegen
// reads, head_dim and block_q / block_kv positive multiples of 16 within their limits.
template <typename ProgramOp> mlir::LogicalResult verifyProgramAttributes(ProgramOp program) {
  const int64_t version = signedValue(program.getVersionAttr()), head_dim = signedValue(program.getHeadDimAttr());
  if (version != kIrVersion)
    return program.emitOpError() << "IR version " << version << " is not supported; this sagegen reads version "
                                 << kIrVersion;
  if (head_dim <= 0 || head_dim % 16 != 0 || head_dim > kMaxHeadDim)
    return program.emitOpError() << "head_dim must be a positive multiple of 16 up to " << kMaxHeadDim << ", got "
                                 << head_dim;
  for (auto [name, value] : {std::pair{"block_q", signedValue(program.getBlockQAttr())},
                             std::pair{"block_kv", signedValue(program.getBlockKvAttr())}})
    if (value <= 0 || value % 16 != 0 || value > kMaxBlockTokens)
      return program.emitOpError() << name << " must be a positive multiple of 16 up to " << kMaxBlockTokens << ", got "
                                   << value;
  return mlir::success();
}

} // namespace sage::ir::detail
