// The subcommands of `sagegen`. Each registers its options on the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <stdexcept>

namespace sage::tool {

// A mistake of the user's (bad file, unknown preset, invalid IR): exit code 1 with the message.
class UserError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

using CommandAction = std::function<void()>;

CommandAction addListCommand(CLI::App &app);
CommandAction addIrCommand(CLI::App &app);
CommandAction addCheckCommand(CLI::App &app);
CommandAction addReferenceCommand(CLI::App &app);
CommandAction addTuneCommand(CLI::App &app);
CommandAction addSelectCommand(CLI::App &app);
CommandAction addExplainCommand(CLI::App &app);
CommandAction addEmitCommand(CLI::App &app);
CommandAction addCacheCommand(CLI::App &app);

} // namespace sage::tool
