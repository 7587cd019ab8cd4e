// Lowers a verified sage.attention op to the MLIR-free AttentionVariant.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/Dialect.h"

namespace sage::ir {

AttentionVariant extractVariant(AttentionOp attention);

} // namespace sage::ir
