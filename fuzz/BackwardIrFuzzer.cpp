// libFuzzer target: the backward IR's parser and verifiers (sage::ir::BackwardProgram::parse, the
// sage.attention_backward op) and the lowering to a BackwardVariant. Property: a program that parses prints to
// text that parses again, prints the same and has the same fingerprint and variant.
#include "sage/ir/BackwardProgram.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  try {
    const sage::ir::BackwardProgram program = sage::ir::BackwardProgram::parse(text, "fuzz.mlir");
    const sage::BackwardVariant variant = program.variant();
    const std::string printed = program.print();
    const sage::ir::BackwardProgram reparsed = sage::ir::BackwardProgram::parse(printed, "printed.mlir");
    if (reparsed.print() != printed || reparsed.fingerprint() != program.fingerprint() ||
        !(reparsed.variant() == variant))
      std::abort(); // printing is not a fixed point: a finding
  } catch (const sage::ir::ProgramError &) {
  }
  return 0;
}
