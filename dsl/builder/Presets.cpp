// The named presets: SageAttention's Table 6 kernels, SageAttention2's FP8 P.V and an exact baseline.
#include "sage/dsl/Presets.h"

#include <string>

namespace sage::dsl {
namespace {

AttentionBuilder makePreset(std::string_view name) {
  AttentionBuilder builder = attention(std::string(name));
  if (name == "sage-t")
    builder.qk(int8(per_token).smooth_k()).pv(f16(accum::f16));
  else if (name == "sage-b")
    builder.qk(int8(per_block).smooth_k()).pv(f16(accum::f16));
  else if (name == "sage-vt")
    builder.qk(int8(per_token).smooth_k()).pv(int8_pv());
  else if (name == "sage-vb")
    builder.qk(int8(per_block).smooth_k()).pv(int8_pv());
  else if (name == "sage2-fp8")
    // Q per warp of 32 rows (a 128-row tile over 4 warps); every warp reads the whole K tile, so K's
    // per-warp group is the 64-token tile.
    builder.qk(int8(per_warp).groups(32, 64).smooth_k()).pv(fp8_e4m3(accum::f32_two_level, 4));
  else
    builder.qk(full_precision()).pv(full_precision_pv());
  return builder;
}

} // namespace

const std::vector<PresetInfo> &presets() {
  static const std::vector<PresetInfo> table = {
      {"sage-t", "SageAttn-T: int8 per-token Q/K, K smoothed; f16 P.V with an f16 accumulator"},
      {"sage-b", "SageAttn-B (Algorithm 1): int8 per-block Q/K, K smoothed; f16 P.V with an f16 accumulator"},
      {"sage-vt", "SageAttn-vT: int8 per-token Q/K, K smoothed; int8 P (1/127) and per-channel int8 V"},
      {"sage-vb", "SageAttn-vB: int8 per-block Q/K, K smoothed; int8 P (1/127) and per-channel int8 V"},
      {"sage2-fp8", "SageAttention2: int8 per-warp Q/K, K smoothed; e4m3 P.V, per-channel V, two-level f32"},
      {"exact", "no quantization: f32 Q, K, P, V and f32 accumulation (the accuracy baseline)"},
  };
  return table;
}

std::optional<AttentionBuilder> preset(std::string_view name, int head_dim, MaskKind mask) {
  for (const PresetInfo &info : presets())
    if (info.name == name) {
      AttentionBuilder builder = makePreset(name);
      builder.head_dim(head_dim).mask(mask);
      return builder;
    }
  return std::nullopt;
}

} // namespace sage::dsl
