// The sage MLIR dialect: generated op, type and enum classes. Include this only where MLIR is needed;
// most code uses sage/ir/Program.h and sage/ir/AttentionVariant.h instead.
#pragma once

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "sage/ir/OpTraits.h"

#include "SageDialect.h.inc"
#include "SageEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "SageAttrs.h.inc"

#define GET_TYPEDEF_CLASSES
#include "SageTypes.h.inc"

#define GET_OP_CLASSES
#include "SageOps.h.inc"
