// Parsing support shared by the forward (Program) and backward (BackwardProgram) programs: the bounds checked
// before MLIR's parser sees untrusted text, and the collection of MLIR's diagnostics.
#pragma once

#include "sage/ir/Program.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"

#include <string>
#include <string_view>
#include <vector>

namespace sage::ir::detail {

std::string locationText(mlir::Location location);

// Collects every error reported while it lives, instead of printing them to stderr.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(mlir::MLIRContext &context)
      : handler_(&context, [this](mlir::Diagnostic &diagnostic) {
          if (diagnostic.getSeverity() == mlir::DiagnosticSeverity::Error)
            diagnostics_.push_back({locationText(diagnostic.getLocation()), diagnostic.str()});
          return mlir::success();
        }) {}
  std::vector<Diagnostic> take() { return std::move(diagnostics_); }

private:
  std::vector<Diagnostic> diagnostics_;
  mlir::ScopedDiagnosticHandler handler_;
};

// Size, NUL bytes and bracket nesting (limits: Program.h); empty when the text may go to MLIR's parser.
std::vector<Diagnostic> checkParserInput(std::string_view text, std::string_view source_name);

// Bounds-checks `text`, then parses and verifies it as a module in `context`; throws ProgramError with every
// diagnostic (or "could not parse the <what>" when MLIR gave none).
mlir::OwningOpRef<mlir::ModuleOp> parseModule(mlir::MLIRContext &context, std::string_view text,
                                              std::string_view source_name, std::string_view what);

// The program's text as `print()` gives it: the operation and a final newline.
std::string printedText(mlir::Operation *operation);

// 64-bit FNV-1a of `text`, as 16 hex digits: the programs' fingerprints.
std::string fingerprintOf(std::string_view text);

} // namespace sage::ir::detail
