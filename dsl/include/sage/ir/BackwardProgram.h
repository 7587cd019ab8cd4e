// A verified backward program (`sage.attention_backward`, SageBwd): parse, print, verify and lower to a
// BackwardVariant without seeing MLIR. The forward's Program is unchanged; a text holds one program of either kind.
#pragma once

#include "sage/ir/BackwardVariant.h"
#include "sage/ir/Program.h"

#include <memory>
#include <string>
#include <string_view>

namespace sage::ir {

class BackwardProgram {
public:
  BackwardProgram(BackwardProgram &&) noexcept;
  BackwardProgram &operator=(BackwardProgram &&) noexcept;
  ~BackwardProgram();

  // Parses and verifies textual IR holding one sage.attention_backward; throws ProgramError (located diagnostics).
  // The same input bounds as Program::parse apply.
  static BackwardProgram parse(std::string_view text, std::string_view source_name = "<input>");
  // Takes ownership of a built module (exactly one sage.attention_backward inside) and verifies it.
  static BackwardProgram adopt(std::unique_ptr<mlir::MLIRContext> context, mlir::ModuleOp module);

  std::string print() const; // the sage.attention_backward op, parseable by parse()
  std::string name() const;
  BackwardVariant variant() const;
  std::string fingerprint() const; // 64-bit FNV-1a of print(), 16 hex digits (as Program's)

private:
  struct State;
  explicit BackwardProgram(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Whether `text` holds a backward program (its first op is sage.attention_backward), judged without parsing: tools
// pick BackwardProgram::parse or Program::parse with it.
bool looksLikeBackwardProgram(std::string_view text);

} // namespace sage::ir
