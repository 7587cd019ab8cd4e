#include "Commands.h"
#include "IrFile.h"

#include "sage/ir/BackwardProgram.h"
#include "sage/ir/Program.h"

#include <fmt/core.h>

#include <memory>

namespace sage::tool {

CommandAction addCheckCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("check", "verify a textual sage IR file; errors come with file:line:col");
  auto path = std::make_shared<std::string>();
  command->add_option("FILE", *path, "the IR file")->required();
  return [path] {
    const std::string text = readIrFile(*path, "FILE");
    if (ir::looksLikeBackwardProgram(text)) {
      const ir::BackwardProgram program = ir::BackwardProgram::parse(text, *path);
      fmt::print("{}: ok (sage.attention_backward @{}, IR version {})\n", *path, program.name(),
                 program.variant().version);
      return;
    }
    ir::Program program = ir::Program::parse(text, *path); // throws ProgramError with locations
    fmt::print("{}: ok (sage.attention @{}, IR version {})\n", *path, program.name(), program.variant().version);
  };
}

} // namespace sage::tool
