// Named presets: the SageAttention kernels of the paper's Table 6 and friends.
#pragma once

#include "sage/dsl/Attention.h"

#include <optional>
#include <string_view>
#include <vector>

namespace sage::dsl {

struct PresetInfo {
  std::string_view name;
  std::string_view summary;
};

// The presets with kernels: every schedule, codegen and AOT test iterates these.
const std::vector<PresetInfo> &presets();

// Presets that the IR, the CPU reference and the legalization pass run, but no kernel schedule yet (issue 11:
// SageAttention3's FP4 and SageAttention2's INT4, with their ablations). preset() resolves these names too.
const std::vector<PresetInfo> &referenceOnlyPresets();

// The builder of a preset (of either list) at the given head dim and mask; nullopt for an unknown name.
std::optional<AttentionBuilder> preset(std::string_view name, int head_dim = 128, MaskKind mask = MaskKind::none);

} // namespace sage::dsl
