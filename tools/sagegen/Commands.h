// The subcommands of `sagegen`. Each registers its options on the app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

namespace sage::tool {

// A mistake of the user's (bad file, unknown preset, invalid IR): exit code 1 with the message.
class UserError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

using CommandAction = std::function<void()>;

// A CLI11 check that a number is finite and in [low, high] (CLI::Range lets NaN through); CLI11 names the option.
inline CLI::Validator finiteRange(double low, double high) {
  return CLI::Validator(
      [low, high](std::string &text) -> std::string {
        char *end = nullptr;
        double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(value) || value < low || value > high)
          return "expected a finite number in [" + CLI::detail::to_string(low) + ", " + CLI::detail::to_string(high) +
                 "], got '" + text + "'";
        return std::string();
      },
      "NUMBER in [" + CLI::detail::to_string(low) + " - " + CLI::detail::to_string(high) + "]");
}

CommandAction addListCommand(CLI::App &app);
CommandAction addIrCommand(CLI::App &app);
CommandAction addCheckCommand(CLI::App &app);
CommandAction addReferenceCommand(CLI::App &app);
CommandAction addReferenceBackwardCommand(CLI::App &app); // SageBwd (issue 12)
CommandAction addTuneCommand(CLI::App &app);
CommandAction addSelectCommand(CLI::App &app);
CommandAction addExplainCommand(CLI::App &app);
CommandAction addEmitCommand(CLI::App &app);
CommandAction addCacheCommand(CLI::App &app);

} // namespace sage::tool
