#include "Commands.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"

#include <fmt/core.h>

namespace sage::tool {

CommandAction addListCommand(CLI::App &app) {
  app.add_subcommand("list", "list the preset variants");
  return [] {
    for (const auto &info : dsl::presets())
      fmt::print("{:<10} {}\n", info.name, info.summary);
    fmt::print("\nNot in the default kernel set (`sagegen explain` says which schedule runs each, and how):\n"
               "  INT4 (issue 11): the sm80 schedule from sm_89, int4 decoded to int8 (ran on an H100)\n"
               "  FP4 (issue 11): the sm120.mma_fp4 schedule on sm_120f (compile-verified only: no Blackwell GPU); "
               "by emulation on the sm80 schedule on sm_80..sm_90a and sm_100f (the legalized program, `sagegen ir "
               "--legalize <arch>`: codes decoded to f16/bf16; ran on an H100)\n"
               "  sagebwd: SageBwd's forward (Algorithm 2), CPU reference only\n");
    for (const auto &info : dsl::referenceOnlyPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
    fmt::print("\nQ and K rotated before quantization (issue 28; every forward schedule, not in the default kernel "
               "set):\n");
    for (const auto &info : dsl::rotatedPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
    fmt::print("\nSLA, sparse-linear attention (`sagegen ir` prints them; the CPU reference is sage/reference/Sla.h; "
               "the GPU runs them through SlaRunner / the C ABI's sage_sla_*, not `sagegen emit`):\n");
    for (const auto &info : dsl::slaPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
    fmt::print("\nBackward programs (SageBwd; `sagegen ir --backward --preset NAME`, `sagegen reference-backward`):\n");
    for (const auto &info : dsl::backwardPresets())
      fmt::print("{:<22} {}\n", info.name, info.summary);
  };
}

} // namespace sage::tool
