// libFuzzer target: the IR parser and verifiers (sage::ir::Program::parse) and the extraction of the variant.
// Property: a program that parses prints to text that parses again and prints the same.
#include "sage/ir/Program.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  try {
    sage::ir::Program program = sage::ir::Program::parse(text, "fuzz.mlir");
    (void)program.variant();
    const std::string printed = program.print();
    if (sage::ir::Program::parse(printed, "printed.mlir").print() != printed)
      std::abort(); // printing is not a fixed point: a finding
  } catch (const sage::ir::ProgramError &) {
  }
  return 0;
}
