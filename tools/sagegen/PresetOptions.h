// Options shared by commands that pick a preset variant: --preset, --headdim, --causal, --lse (and --packed where a
// command adds it).
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
  bool packed = false; // packed variable-length sequences (issue 28)

  void addTo(CLI::App &command, bool with_lse = true) {
    command.add_option("--headdim", head_dim, "head dimension d (a multiple of 16, at most 256)")
        ->capture_default_str();
    command.add_flag("--causal", causal, "causal mask (bottom-right aligned when n_q != n_kv)");
    if (with_lse)
      command.add_flag("--lse", lse, "also write the LSE (corrected for K smoothing)");
  }

  // --packed: the preset on packed variable-length sequences (FlashAttention's varlen), for the commands that show a
  // variant and its verdicts (ir, explain).
  void addPackedTo(CLI::App &command) {
    command.add_flag("--packed", packed,
                     "the variant on packed variable-length sequences (cu_seqlens; each sequence's statistics and "
                     "causal alignment its own)");
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
    found->packed_sequences(packed);
    return *found;
  }
};

} // namespace sage::tool
