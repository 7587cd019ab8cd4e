// A verified sage program: parse, print, verify and lower to an AttentionVariant without seeing MLIR.
#pragma once

#include "sage/ir/AttentionVariant.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mlir {
class MLIRContext;
class ModuleOp;
} // namespace mlir

namespace sage::ir {

// Textual programs are at most this large, and their brackets nest at most kMaxNesting deep (checked before MLIR's
// recursive parser sees the text).
inline constexpr size_t kMaxProgramBytes = size_t(1) << 20;
inline constexpr size_t kMaxNesting = 32;

struct Diagnostic {
  std::string location; // "file:line:col", or the op's name when it has no file location
  std::string message;
  std::string text() const { return location.empty() ? "error: " + message : location + ": error: " + message; }
};

// Thrown when text does not parse or a program does not verify; carries every diagnostic.
class ProgramError : public std::runtime_error {
public:
  explicit ProgramError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic> &diagnostics() const { return diagnostics_; }

private:
  std::vector<Diagnostic> diagnostics_;
};

class Program {
public:
  Program(Program &&) noexcept;
  Program &operator=(Program &&) noexcept;
  ~Program();

  // Parses and verifies textual IR; throws ProgramError with located diagnostics.
  static Program parse(std::string_view text, std::string_view source_name = "<input>");

  // A context with the sage dialect loaded, for builders that construct a module directly.
  static std::unique_ptr<mlir::MLIRContext> makeContext();
  // Takes ownership of a built module (exactly one sage.attention inside) and verifies it.
  static Program adopt(std::unique_ptr<mlir::MLIRContext> context, mlir::ModuleOp module);

  std::string print() const; // the sage.attention op, parseable by parse()
  std::string name() const;  // the variant's symbol name
  AttentionVariant variant() const;
  // 64-bit FNV-1a of the printed IR as 16 hex digits: the IR part of a kernel cache key.
  std::string fingerprint() const;

  mlir::ModuleOp module() const;

private:
  struct State;
  explicit Program(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

} // namespace sage::ir
