// Options shared by commands that pick a preset variant: --preset, --headdim, --causal, --lse.
#pragma once

#include "Commands.h"

#include "sage/dsl/Presets.h"

#include <string>

namespace sage::tool {

struct PresetOptions {
  std::string preset = "sage-b";
  int head_dim = 128;
  bool causal = false;
  bool lse = false;

  void addTo(CLI::App &command, bool with_lse = true) {
    command.add_option("--headdim", head_dim, "head dimension d (a multiple of 16, at most 256)")
        ->capture_default_str();
    command.add_flag("--causal", causal, "causal mask (bottom-right aligned when n_q != n_kv)");
    if (with_lse)
      command.add_flag("--lse", lse, "also write the LSE (corrected for K smoothing)");
  }

  // The builder of `name` (default: the --preset value); a UserError names the known presets.
  dsl::AttentionBuilder builder(const std::string &name) const {
    auto found = dsl::preset(name, head_dim, causal ? MaskKind::causal : MaskKind::none);
    if (!found) {
      std::string known;
      for (const auto *table : {&dsl::presets(), &dsl::referenceOnlyPresets()})
        for (const auto &info : *table)
          known += (known.empty() ? "" : ", ") + std::string(info.name);
      throw UserError("--preset: unknown preset '" + name + "'; expected one of " + known);
    }
    found->lse(lse);
    return *found;
  }
};

} // namespace sage::tool
