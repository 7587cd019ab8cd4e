// Attention variants for the prologue tests, built by hand (no DSL, no MLIR): every quantizer granularity,
// unquantized Q/K (granularity none: a cast), with and without Q/K/V smoothing, and each kind of V (f16 in
// place or converted, int8, e4m3). The DSL's presets are tested as well, where the tests link the DSL.
#pragma once

#include "sage/ir/AttentionVariant.h"

#include <string>
#include <vector>

namespace sage::prologue_test {

enum class VKind { f16, int8, e4m3 };

struct VariantKind {
  std::string name;
  ElementType qk_dtype = ElementType::int8;
  Granularity granularity = Granularity::per_block;
  int q_group_tokens = 0; // 0: the tile
  int k_group_tokens = 0;
  bool smooth_q = false, smooth_k = true, smooth_v = false;
  VKind v = VKind::f16;
};

inline QuantizerSpec tokenQuantizer(ElementType dtype, Granularity granularity, int group_tokens) {
  QuantizerSpec spec;
  spec.dtype = dtype;
  spec.granularity = granularity;
  spec.group_tokens = group_tokens;
  return spec;
}

inline AttentionVariant makeVariant(const VariantKind &kind, int head_dim, int block_q = 128, int block_kv = 64) {
  const bool grouped = kind.granularity == Granularity::per_block || kind.granularity == Granularity::per_warp ||
                       kind.granularity == Granularity::per_thread;
  AttentionVariant variant;
  variant.name = kind.name;
  variant.head_dim = head_dim;
  variant.block_q = block_q;
  variant.block_kv = block_kv;
  variant.smooth_q = kind.smooth_q ? SmoothScope::block : SmoothScope::none;
  variant.smooth_k = kind.smooth_k ? SmoothScope::sequence : SmoothScope::none;
  variant.smooth_v = kind.smooth_v ? SmoothScope::sequence : SmoothScope::none;
  variant.q = tokenQuantizer(kind.qk_dtype, kind.granularity,
                             grouped ? (kind.q_group_tokens ? kind.q_group_tokens : block_q) : 0);
  variant.q.fold_softmax_scale = true;
  variant.k = tokenQuantizer(kind.qk_dtype, kind.granularity,
                             grouped ? (kind.k_group_tokens ? kind.k_group_tokens : block_kv) : 0);
  const bool unquantized = kind.granularity == Granularity::none;
  variant.qk = {kind.qk_dtype, kind.qk_dtype, unquantized ? AccumulatorType::f32 : AccumulatorType::s32};
  // P~ and V in `dtype` (P~ with one scale or none, V per channel or none), multiplied into `accumulator`.
  auto pv = [&](ElementType dtype, Granularity p_granularity, Granularity v_granularity, AccumulatorType accumulator) {
    variant.p = tokenQuantizer(dtype, p_granularity, 0);
    variant.v = tokenQuantizer(dtype, v_granularity, 0);
    variant.pv = {dtype, dtype, accumulator};
  };
  switch (kind.v) {
  case VKind::f16:
    pv(ElementType::f16, Granularity::none, Granularity::none, AccumulatorType::f16);
    variant.accumulation = {AccumulationKind::f16, 0};
    break;
  case VKind::int8:
    pv(ElementType::int8, Granularity::per_tensor, Granularity::per_channel, AccumulatorType::s32);
    variant.p.static_scale = 1.0 / 127.0;
    break;
  case VKind::e4m3:
    pv(ElementType::e4m3, Granularity::per_tensor, Granularity::per_channel, AccumulatorType::f32);
    variant.p.static_scale = 1.0 / 448.0;
    variant.accumulation = {AccumulationKind::f32_two_level, 4};
    break;
  }
  return variant;
}

// One of each kind the prologue distinguishes.
inline std::vector<VariantKind> variantKinds() {
  using G = Granularity;
  return {
      {"per_token_smooth_k_f16_v", ElementType::int8, G::per_token, 0, 0, false, true, false, VKind::f16},
      {"per_block_smooth_k_f16_v", ElementType::int8, G::per_block, 0, 0, false, true, false, VKind::f16},
      {"per_warp_smooth_k_e4m3_v", ElementType::int8, G::per_warp, 32, 64, false, true, false, VKind::e4m3},
      {"per_thread_smooth_k_f16_v", ElementType::int8, G::per_thread, 32, 64, false, true, false, VKind::f16},
      {"per_block_unsmoothed_f16_v", ElementType::int8, G::per_block, 0, 0, false, false, false, VKind::f16},
      {"per_block_smooth_qkv_f16_v", ElementType::int8, G::per_block, 0, 0, true, true, true, VKind::f16},
      {"per_token_smooth_k_int8_v", ElementType::int8, G::per_token, 0, 0, false, true, false, VKind::int8},
      {"per_block_smooth_kv_int8_v", ElementType::int8, G::per_block, 0, 0, false, true, true, VKind::int8},
      {"per_tensor_smooth_qk_int8_v", ElementType::int8, G::per_tensor, 0, 0, true, true, false, VKind::int8},
      {"per_tensor_unsmoothed_f16_v", ElementType::int8, G::per_tensor, 0, 0, false, false, false, VKind::f16},
      {"e4m3_qk_per_block_smooth_kv_e4m3_v", ElementType::e4m3, G::per_block, 0, 0, false, true, true, VKind::e4m3},
      // Unquantized Q and K, copied in the input type: with the softmax scale folded into Q and K smoothed (the
      // exact preset, neither, comes from the DSL).
      {"unquantized_folded_smooth_k_f16_v", ElementType::f32, G::none, 0, 0, false, true, false, VKind::f16},
  };
}

} // namespace sage::prologue_test
