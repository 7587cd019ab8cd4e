#include "PresetOptions.h"

#include "sage/ir/Legalize.h"

#include <fmt/core.h>

#include <memory>

namespace sage::tool {

CommandAction addIrCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("ir", "print the sage IR of a preset");
  auto options = std::make_shared<PresetOptions>();
  auto target = std::make_shared<std::string>();
  command->add_option("--preset", options->preset, "preset name (see `sagegen list`)")->required();
  command->add_option("--legalize", *target,
                      "rewrite it for a target (sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a): FP4/INT4 mma "
                      "operands the target cannot multiply are decoded (exactly) to f16/bf16/int8");
  options->addTo(*command);
  return [options, target] {
    const ir::Program program = options->builder(options->preset).build();
    if (target->empty()) {
      fmt::print("{}", program.print());
      return;
    }
    if (!ir::targetCapabilities(*target))
      throw UserError("--legalize: unknown target '" + *target +
                      "'; expected one of sm_80, sm_86, sm_89, sm_90a, "
                      "sm_100a, sm_120a");
    fmt::print("{}", ir::legalizeForTarget(program, *target).print());
  };
}

} // namespace sage::tool
