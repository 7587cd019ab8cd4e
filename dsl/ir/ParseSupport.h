// Parsing support shared by the forward (Program) and backward (BackwardProgram) programs: the bounds checked
// before MLIR's parser sees untrusted text, and the collection of MLIR's diagnostics.
#pragma once

#include "sage/ir/Program.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/Verifier.h"

#include <memory>

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

// What Program and BackwardProgram hold: the context and the module in it.
struct ModuleState {
  std::unique_ptr<mlir::MLIRContext> context;
  mlir::OwningOpRef<mlir::ModuleOp> module;
};

// The module's ProgramOp (sage.attention, sage.attention_backward); null when there is none.
template <typename ProgramOp> ProgramOp programOpOf(mlir::ModuleOp module) {
  ProgramOp found;
  for (mlir::Operation &op : module.getBody()->getOperations())
    if (auto program = mlir::dyn_cast<ProgramOp>(op))
      found = program;
  return found;
}

// A `kind` ("sage program", "backward program") module holds exactly one ProgramOp and nothing else; empty when it
// does.
template <typename ProgramOp> std::vector<Diagnostic> checkTopLevel(mlir::ModuleOp module, std::string_view kind) {
  const std::string program = "a " + std::string(kind), op_name = ProgramOp::getOperationName().str();
  int count = 0;
  for (mlir::Operation &op : module.getBody()->getOperations()) {
    if (!mlir::isa<ProgramOp>(op))
      return {{locationText(op.getLoc()), "'" + op.getName().getStringRef().str() + "' at top level: " + program +
                                              " holds one " + op_name + " only"}};
    ++count;
  }
  if (count != 1)
    return {{"", program + " holds exactly one " + op_name + ", found " + std::to_string(count)}};
  return {};
}

// Parses `text` as a `kind` module of one ProgramOp into `state` (a fresh context); throws ProgramError.
template <typename ProgramOp>
void parseProgramModule(ModuleState &state, std::string_view text, std::string_view source_name,
                        std::string_view kind) {
  state.context = Program::makeContext();
  state.module = parseModule(*state.context, text, source_name, kind);
  if (auto problems = checkTopLevel<ProgramOp>(*state.module, kind); !problems.empty())
    throw ProgramError(std::move(problems));
}

// Takes `module` (built in `context`) into `state`, then checks and verifies it as a `kind` module; throws
// ProgramError.
template <typename ProgramOp>
void adoptProgramModule(ModuleState &state, std::unique_ptr<mlir::MLIRContext> context, mlir::ModuleOp module,
                        std::string_view kind) {
  state.context = std::move(context);
  state.module = mlir::OwningOpRef<mlir::ModuleOp>(module);
  DiagnosticCollector collector(*state.context);
  if (auto problems = checkTopLevel<ProgramOp>(*state.module, kind); !problems.empty())
    throw ProgramError(std::move(problems));
  if (mlir::failed(mlir::verify(*state.module)))
    throw ProgramError(collector.take());
}

// The program's text as `print()` gives it: the operation and a final newline.
std::string printedText(mlir::Operation *operation);

// 64-bit FNV-1a of `text`, as 16 hex digits: the programs' fingerprints.
std::string fingerprintOf(std::string_view text);

} // namespace sage::ir::detail
