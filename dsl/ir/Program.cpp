#include "sage/ir/Program.h"

#include "Extract.h"
#include "ParseSupport.h"
#include "sage/ir/Dialect.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>

namespace sage::ir {

struct Program::State : detail::ModuleState {};

namespace {

std::string joinMessages(const std::vector<Diagnostic> &diagnostics) {
  std::string text;
  for (const Diagnostic &diagnostic : diagnostics) {
    if (!text.empty())
      text.push_back('\n');
    text.append(diagnostic.text());
  }
  return text.empty() ? std::string("invalid sage program") : text;
}

AttentionOp attentionOf(mlir::ModuleOp module) { return detail::programOpOf<AttentionOp>(module); }

// A module must hold exactly one sage.attention and nothing else.
constexpr std::string_view kKind = "sage program";

} // namespace

ProgramError::ProgramError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(joinMessages(diagnostics)), diagnostics_(std::move(diagnostics)) {}

Program::Program(std::unique_ptr<State> state) : state_(std::move(state)) {}
Program::Program(Program &&) noexcept = default;
Program &Program::operator=(Program &&) noexcept = default;
Program::~Program() = default;

std::unique_ptr<mlir::MLIRContext> Program::makeContext() {
  auto context = std::make_unique<mlir::MLIRContext>(mlir::MLIRContext::Threading::DISABLED);
  context->getOrLoadDialect<SageDialect>();
  return context;
}

Program Program::parse(std::string_view text, std::string_view source_name) {
  auto state = std::make_unique<State>();
  detail::parseProgramModule<AttentionOp>(*state, text, source_name, kKind);
  return Program(std::move(state));
}

Program Program::adopt(std::unique_ptr<mlir::MLIRContext> context, mlir::ModuleOp module) {
  auto state = std::make_unique<State>();
  detail::adoptProgramModule<AttentionOp>(*state, std::move(context), module, kKind);
  return Program(std::move(state));
}

std::string Program::print() const { return detail::printedText(attentionOf(*state_->module)); }

std::string Program::name() const { return attentionOf(*state_->module).getSymName().str(); }

AttentionVariant Program::variant() const { return extractVariant(attentionOf(*state_->module)); }

std::string Program::fingerprint() const { return detail::fingerprintOf(print()); }

mlir::ModuleOp Program::module() const { return *state_->module; }

} // namespace sage::ir
