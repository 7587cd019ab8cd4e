// Registration of the sage dialect's ops, types and attributes (the definitions are generated).
#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include "SageDialect.cpp.inc"
#include "SageEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "SageAttrs.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "SageTypes.cpp.inc"

#define GET_OP_CLASSES
#include "SageOps.cpp.inc"

namespace sage::ir {

void SageDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "SageOps.cpp.inc"
      >();
  addTypes<
#define GET_TYPEDEF_LIST
#include "SageTypes.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "SageAttrs.cpp.inc"
      >();
}

} // namespace sage::ir
