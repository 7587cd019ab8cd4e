#include "Commands.h"

#include "sage/ir/Program.h"

#include <fmt/core.h>

#include <fstream>
#include <memory>
#include <sstream>

namespace sage::tool {

CommandAction addCheckCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("check", "verify a textual sage IR file; errors come with file:line:col");
  auto path = std::make_shared<std::string>();
  command->add_option("FILE", *path, "the IR file")->required();
  return [path] {
    std::ifstream file(*path);
    if (!file)
      throw UserError("FILE: cannot open '" + *path + "'");
    std::stringstream text;
    text << file.rdbuf();
    ir::Program program = ir::Program::parse(text.str(), *path); // throws ProgramError with locations
    fmt::print("{}: ok (sage.attention @{}, IR version {})\n", *path, program.name(), program.variant().version);
  };
}

} // namespace sage::tool
