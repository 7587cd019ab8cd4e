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

// Issue 11's presets (SageAttention3's FP4 and SageAttention2's INT4, with their ablations), kept out of presets()
// (the default AOT kernel set, and the tests that expect every schedule to run a preset): the IR, the CPU reference
// and the legalization pass run all of them; the sm80 schedule runs the INT4 ones (int4 decoded to int8, Q
// smoothing's delta_s) and the FP4 ones by emulation (decoded to f16/bf16). preset() resolves these names too.
const std::vector<PresetInfo> &referenceOnlyPresets();

// Presets with Q and K rotated before quantization (issue 28: a randomized Hadamard transform along d, exact in exact
// arithmetic), for inputs with outlier channels. Every forward schedule runs them (the prologue rotates); they are
// kept out of presets() so that the default AOT kernel set and its tests stay as they are. preset() resolves them.
const std::vector<PresetInfo> &rotatedPresets();

// SLA presets (issue 13): sparse-linear attention at the paper's settings (b_q = b_kv = 64, k_h = 5%, k_l = 10%,
// phi = softmax). The CPU reference runs them (sage/reference/Sla.h); no kernel schedule runs them yet, so they
// are in neither list above. preset() resolves these names too; they take no mask but no_mask.
const std::vector<PresetInfo> &slaPresets();

// The builder of a preset (of any list) at the given head dim and mask; nullopt for an unknown name.
std::optional<AttentionBuilder> preset(std::string_view name, int head_dim = 128, MaskKind mask = MaskKind::none);

} // namespace sage::dsl
