// sagegen: generator of quantized attention kernels. Exit codes: 0 ok, 1 user error, 2 internal error.
#include "Commands.h"

#include "sage/ir/Program.h"

#include <fmt/core.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <utility>
#include <vector>

int main(int argc, char **argv) {
  CLI::App app{"sagegen: a compiler-style generator of quantized (SageAttention-family) attention kernels"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App *, sage::tool::CommandAction>> commands;
  auto add = [&](sage::tool::CommandAction (*adder)(CLI::App &)) {
    size_t before = app.get_subcommands({}).size();
    sage::tool::CommandAction action = adder(app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(action));
  };
  add(sage::tool::addListCommand);
  add(sage::tool::addIrCommand);
  add(sage::tool::addCheckCommand);
  add(sage::tool::addReferenceCommand);
  add(sage::tool::addReferenceBackwardCommand);
  add(sage::tool::addTuneCommand);
  add(sage::tool::addSelectCommand);
  add(sage::tool::addExplainCommand);
  add(sage::tool::addEmitCommand);
  add(sage::tool::addCacheCommand);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &error) {
    int code = app.exit(error);
    return code == 0 ? 0 : 1;
  }
  try {
    for (auto &[command, action] : commands)
      if (command->parsed())
        action();
    return 0;
  } catch (const sage::tool::UserError &error) {
    fmt::print(stderr, "sagegen: {}\n", error.what());
    return 1;
  } catch (const sage::ir::ProgramError &error) {
    for (const auto &diagnostic : error.diagnostics())
      fmt::print(stderr, "{}\n", diagnostic.text());
    return 1;
  } catch (const std::invalid_argument &error) {
    fmt::print(stderr, "sagegen: {}\n", error.what());
    return 1;
  } catch (const std::exception &error) {
    fmt::print(stderr, "sagegen: internal error: {}\n", error.what());
    return 2;
  }
}
