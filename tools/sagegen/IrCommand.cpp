#include "PresetOptions.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/ir/Legalize.h"

#include <fmt/core.h>

#include <memory>

namespace sage::tool {

CommandAction addIrCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("ir", "print the sage IR of a preset");
  auto options = std::make_shared<PresetOptions>();
  auto target = std::make_shared<std::string>();
  auto backward = std::make_shared<bool>(false);
  command->add_option("--preset", options->preset, "preset name (see `sagegen list`)")->required();
  command->add_option("--legalize", *target,
                      "rewrite it for a target (sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a): FP4/INT4 mma "
                      "operands the target cannot multiply are decoded (exactly) to f16/bf16/int8");
  command->add_flag("--backward", *backward,
                    "print the backward program of a backward preset (sagebwd, sagebwd-int8-dp, exact-bwd)");
  options->addTo(*command);
  options->addPackedTo(*command);
  return [options, target, backward] {
    if (*backward) {
      if (!target->empty())
        throw UserError("--legalize: backward programs have no legalization");
      if (options->packed)
        throw UserError("--packed: backward programs are not built for packed sequences");
      auto found =
          dsl::backwardPreset(options->preset, options->head_dim, options->causal ? MaskKind::causal : MaskKind::none);
      if (!found) {
        std::string known;
        for (const auto &info : dsl::backwardPresets())
          known += (known.empty() ? "" : ", ") + std::string(info.name);
        throw UserError("--preset: unknown backward preset '" + options->preset + "'; expected one of " + known);
      }
      fmt::print("{}", found->build().print());
      return;
    }
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
