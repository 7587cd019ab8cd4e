// What the forward (EmitProgram.cpp) and backward (EmitBackwardProgram.cpp) emitters share: the mapping of the
// vocabulary's names to the dialect's enums, and a builder at the end of the module with the ops' locations.
#pragma once

#include "sage/ir/Dialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sage::dsl::detail {

// The dialect's enums share their spellings with the vocabulary's.
template <typename Result>
Result toDialect(std::optional<Result> (*symbolize)(llvm::StringRef), std::string_view name) {
  std::optional<Result> value = symbolize(llvm::StringRef(name.data(), name.size()));
  if (!value)
    throw std::logic_error("no sage dialect keyword for '" + std::string(name) + "'");
  return *value;
}

// Appends ops to the end of `module`; each op's location names its step of the algorithm.
class ModuleEmitter {
public:
  ModuleEmitter(mlir::MLIRContext &context, mlir::ModuleOp module) : builder_(&context) {
    builder_.setInsertionPointToEnd(module.getBody());
  }

protected:
  mlir::Location location(llvm::StringRef step) { return mlir::NameLoc::get(builder_.getStringAttr(step)); }
  mlir::Type tileType() { return builder_.getType<ir::TileType>(); }

  mlir::OpBuilder builder_;
};

} // namespace sage::dsl::detail
