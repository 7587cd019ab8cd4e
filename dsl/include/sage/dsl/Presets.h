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

const std::vector<PresetInfo> &presets();

// The builder of a preset at the given head dim and mask; nullopt for an unknown name.
std::optional<AttentionBuilder> preset(std::string_view name, int head_dim = 128, MaskKind mask = MaskKind::none);

} // namespace sage::dsl
