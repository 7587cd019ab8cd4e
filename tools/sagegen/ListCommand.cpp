#include "Commands.h"

#include "sage/dsl/Presets.h"

#include <fmt/core.h>

namespace sage::tool {

CommandAction addListCommand(CLI::App &app) {
  app.add_subcommand("list", "list the preset variants");
  return [] {
    for (const auto &info : dsl::presets())
      fmt::print("{:<10} {}\n", info.name, info.summary);
    fmt::print(
        "\nIssue 11 (not in the default kernel set): the INT4 ones run on the sm80 schedule from sm_89 (int4 "
        "decoded to int8; compile-verified, not yet run on a GPU as of 2026-11-23), the FP4 ones in the IR and CPU "
        "reference only (`sagegen explain` says which; "
        "`sagegen ir --legalize <arch>` shows the rewrite):\n");
    for (const auto &info : dsl::referenceOnlyPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
    fmt::print("\nSLA, sparse-linear attention (`sagegen ir` prints them; the CPU reference is sage/reference/Sla.h; "
               "the GPU runs them through SlaRunner / the C ABI's sage_sla_*, not `sagegen emit`):\n");
    for (const auto &info : dsl::slaPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
  };
}

} // namespace sage::tool
