// The named presets built by hand (mirroring sage/dsl/Presets.cpp) so schedule and codegen tests do not
// depend on the DSL or MLIR.
#pragma once

#include "sage/ir/AttentionVariant.h"

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sage::test {

inline const std::vector<std::string> &presetNames() {
  static const std::vector<std::string> names = {"sage-t", "sage-b", "sage-vt", "sage-vb", "sage2-fp8", "exact"};
  return names;
}

inline QuantizerSpec quantizer(ElementType dtype, Granularity granularity, int group_tokens = 0) {
  QuantizerSpec spec;
  spec.dtype = dtype;
  spec.granularity = granularity;
  spec.group_tokens = group_tokens;
  return spec;
}

inline QuantizerSpec cast(ElementType dtype) { return quantizer(dtype, Granularity::none); }

inline QuantizerSpec staticScale(ElementType dtype, double scale) {
  QuantizerSpec spec = quantizer(dtype, Granularity::per_tensor);
  spec.static_scale = scale;
  return spec;
}

// int8 Q (scale folded) and K, K smoothed over the sequence.
inline void int8Qk(AttentionVariant &variant, Granularity granularity, int q_group, int k_group) {
  variant.q = quantizer(ElementType::int8, granularity, q_group);
  variant.q.fold_softmax_scale = true;
  variant.k = quantizer(ElementType::int8, granularity, k_group);
  variant.smooth_k = SmoothScope::sequence;
  variant.qk = {ElementType::int8, ElementType::int8, AccumulatorType::s32};
}

inline void f16Pv(AttentionVariant &variant) {
  variant.p = cast(ElementType::f16);
  variant.v = cast(ElementType::f16);
  variant.pv = {ElementType::f16, ElementType::f16, AccumulatorType::f16};
  variant.accumulation = {AccumulationKind::f16, 0};
}

inline void int8Pv(AttentionVariant &variant) {
  variant.p = staticScale(ElementType::int8, 1.0 / 127.0);
  variant.v = quantizer(ElementType::int8, Granularity::per_channel);
  variant.pv = {ElementType::int8, ElementType::int8, AccumulatorType::s32};
  variant.accumulation = {AccumulationKind::f32, 0};
}

inline AttentionVariant presetVariant(std::string_view name, int head_dim = 128, MaskKind mask = MaskKind::none,
                                      bool write_lse = false) {
  AttentionVariant variant;
  variant.name = std::string(name);
  variant.head_dim = head_dim;
  variant.mask.kind = mask;
  if (name == "sage-t") {
    int8Qk(variant, Granularity::per_token, 0, 0);
    f16Pv(variant);
  } else if (name == "sage-b") {
    int8Qk(variant, Granularity::per_block, variant.block_q, variant.block_kv);
    f16Pv(variant);
  } else if (name == "sage-vt") {
    int8Qk(variant, Granularity::per_token, 0, 0);
    int8Pv(variant);
  } else if (name == "sage-vb") {
    int8Qk(variant, Granularity::per_block, variant.block_q, variant.block_kv);
    int8Pv(variant);
  } else if (name == "sage2-fp8") {
    // Q per warp of 32 rows, K per 64-token tile (the DSL preset's choice).
    int8Qk(variant, Granularity::per_warp, 32, 64);
    variant.p = staticScale(ElementType::e4m3, 1.0 / 448.0);
    variant.v = quantizer(ElementType::e4m3, Granularity::per_channel);
    variant.pv = {ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32};
    variant.accumulation = {AccumulationKind::f32_two_level, 4};
  } else if (name == "exact") {
    variant.q = cast(ElementType::f32);
    variant.k = cast(ElementType::f32);
    variant.qk = {ElementType::f32, ElementType::f32, AccumulatorType::f32};
    variant.p = cast(ElementType::f32);
    variant.v = cast(ElementType::f32);
    variant.pv = {ElementType::f32, ElementType::f32, AccumulatorType::f32};
    variant.accumulation = {AccumulationKind::f32, 0};
  } else {
    throw std::invalid_argument("presetVariant: unknown preset '" + std::string(name) + "'");
  }
  variant.epilogue.write_lse = write_lse;
  variant.epilogue.lse_smoothing_correction = write_lse && variant.smooth_k != SmoothScope::none;
  return variant;
}

} // namespace sage::test
