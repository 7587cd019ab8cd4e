// The named presets for schedule and codegen tests, taken from the DSL itself (sage/dsl/Presets.h) so the
// tests exercise exactly what users build.
#pragma once

#include "sage/dsl/Presets.h"

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sage::test {

inline const std::vector<std::string> &presetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const dsl::PresetInfo &info : dsl::presets())
      all.emplace_back(info.name);
    return all;
  }();
  return names;
}

// Building blocks for variants the presets do not cover (unsupported-by-schedule cases in tests).
inline QuantizerSpec quantizer(ElementType dtype, Granularity granularity, int group_tokens = 0) {
  QuantizerSpec spec;
  spec.dtype = dtype;
  spec.granularity = granularity;
  spec.group_tokens = group_tokens;
  return spec;
}

inline QuantizerSpec cast(ElementType dtype) { return quantizer(dtype, Granularity::none); }

inline AttentionVariant presetVariant(std::string_view name, int head_dim = 128, MaskKind mask = MaskKind::none,
                                      bool write_lse = false) {
  auto builder = dsl::preset(name, head_dim, mask);
  if (!builder)
    throw std::invalid_argument("presetVariant: unknown preset '" + std::string(name) + "'");
  return builder->lse(write_lse).describe();
}

} // namespace sage::test
