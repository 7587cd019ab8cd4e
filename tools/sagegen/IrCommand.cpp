#include "PresetOptions.h"

#include <fmt/core.h>

#include <memory>

namespace sage::tool {

CommandAction addIrCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("ir", "print the sage IR of a preset");
  auto options = std::make_shared<PresetOptions>();
  command->add_option("--preset", options->preset, "preset name (see `sagegen list`)")->required();
  options->addTo(*command);
  return [options] { fmt::print("{}", options->builder(options->preset).build().print()); };
}

} // namespace sage::tool
