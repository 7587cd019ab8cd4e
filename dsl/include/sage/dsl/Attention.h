// The C++ DSL: a small fluent builder for attention variants that emits the sage IR.
//
//   using namespace sage::dsl;
//   ir::Program program = attention("my_kernel")
//                             .qk(int8(per_block).smooth_k())
//                             .pv(f16(accum::f16))
//                             .mask(causal)
//                             .build();
//
// Defaults that depend on the tiles are folded here: `per_block` groups are the tile itself (b_q
// tokens for Q, b_kv for K) unless a group size is given.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/Program.h"

#include <cstdint>
#include <string>

namespace sage::dsl {

inline constexpr Granularity per_tensor = Granularity::per_tensor;
inline constexpr Granularity per_token = Granularity::per_token;
inline constexpr Granularity per_block = Granularity::per_block;
inline constexpr Granularity per_warp = Granularity::per_warp;
inline constexpr Granularity per_thread = Granularity::per_thread;

inline constexpr MaskKind no_mask = MaskKind::none;
inline constexpr MaskKind causal = MaskKind::causal;
inline constexpr MaskKind block_sparse = MaskKind::block_sparse;

namespace accum {
inline constexpr AccumulationKind f16 = AccumulationKind::f16;
inline constexpr AccumulationKind f32 = AccumulationKind::f32;
inline constexpr AccumulationKind f16_then_f32 = AccumulationKind::f16_then_f32;
inline constexpr AccumulationKind f32_two_level = AccumulationKind::f32_two_level;
} // namespace accum

// The seed of `.rotate()` without one: any fixed value serves, the signs need only look random to the data.
inline constexpr uint32_t kDefaultRotationSeed = 0;

// How Q and K are smoothed and quantized for S = Q.K^T.
struct QkQuantization {
  QuantizerSpec q, k;
  SmoothScope smooth_q_scope = SmoothScope::none;
  SmoothScope smooth_k_scope = SmoothScope::none;

  QkQuantization &smooth_k(); // K - mean over tokens (SageAttention)
  QkQuantization &smooth_q(); // Q - mean over each Q block (SageAttention2)
  // Rotate Q and K along head_dim by the same randomized Hadamard transform (signs drawn from `seed`) before they are
  // quantized, after smoothing: Q.K^T is unchanged in exact arithmetic, and outlier channels no longer set a group's
  // scale alone (issue 28; sage/numerics/Hadamard.h). head_dim must be a power of two.
  QkQuantization &rotate(uint32_t seed = kDefaultRotationSeed);
  // Tokens sharing one scale, for per_block / per_warp / per_thread (0: the tile).
  QkQuantization &groups(int q_group_tokens, int k_group_tokens);
};

QkQuantization int8(Granularity granularity);
QkQuantization int4(Granularity granularity);
QkQuantization full_precision(); // no quantization: f32 Q and K
QkQuantization f16_qk();         // Q and K cast to f16, f32 accumulation (SLA's exact sparse part)
// FP4 Q and K (SageAttention3): E2M1 values with microscales along head_dim; the softmax scale is folded into Q.
QkQuantization nvfp4(); // 1x16 groups, UE4M3 scales
QkQuantization mxfp4(); // 1x32 groups, UE8M0 (power-of-two) scales: the paper's ablation

// How P and V are represented for O = P.V and how O is accumulated.
struct PvQuantization {
  QuantizerSpec p, v;
  AccumulatorType mma_accumulator = AccumulatorType::f32;
  AccumulationSpec accumulation;
  SmoothScope smooth_v_scope = SmoothScope::none;

  PvQuantization &smooth_v();                 // V - mean over tokens, added back after normalization
  PvQuantization &flush_every(int kv_blocks); // flush period of a two-level accumulation
};

PvQuantization f16(AccumulationKind accumulation, int flush_period = 0); // P, V in f16 (SageAttention T/B)
PvQuantization int8_pv(); // P int8 with static scale 1/127, V int8 per-channel, f32 accumulation (vT/vB)
// SageBwd's forward (SageAttention3, Algorithm 2): P~ int8 per token, its scale exp(rowmax(S) - m) / 127 reusing the
// online softmax's max; V int8 with one scale per KV tile (per_block, b_kv tokens); s32 mma, f32 accumulation.
PvQuantization int8_pv_per_token_p();
PvQuantization fp8_e4m3(AccumulationKind accumulation = AccumulationKind::f32_two_level, int flush_period = 2);
PvQuantization full_precision_pv(); // f32 P and V, f32 accumulation
// FP4 P and V (SageAttention3), microscaled along the KV axis, f32 accumulation. NVFP4 P is two-level by default
// (Algorithm 1 line 10: a per-row f32 scale rowmax/(448*6), then the 1x16 microscales); `two_level_p = false`
// microscales P~ directly (the ablation).
PvQuantization nvfp4_pv(bool two_level_p = true);
PvQuantization mxfp4_pv(); // 1x32 UE8M0 microscales, P quantized directly

class AttentionBuilder {
public:
  explicit AttentionBuilder(std::string name);

  AttentionBuilder &head_dim(int dimension);
  AttentionBuilder &blocks(int block_q, int block_kv); // the paper's b_q and b_kv
  AttentionBuilder &qk(const QkQuantization &spec);
  AttentionBuilder &pv(const PvQuantization &spec);
  AttentionBuilder &mask(MaskKind kind);
  AttentionBuilder &lse(bool write = true); // also write the LSE (corrected for K smoothing)
  AttentionBuilder &name(std::string name);
  // SLA (issue 13): mask prediction, the linear branch and O = O^s + Proj(O^l); the variant's attention becomes its
  // sparse part, block_sparse over the predicted critical blocks (so the mask must be no_mask or block_sparse).
  AttentionBuilder &sla(const SlaSpec &spec);
  // Variable-length batches (issue 28): run on sequences packed along the tokens (FlashAttention's varlen), each
  // sequence computed as this variant computes it alone. Not with SLA or a block_sparse mask (packedSequencesOf).
  AttentionBuilder &packed_sequences(bool packed = true);

  // The normalized description (groups resolved); build().variant() returns the same.
  AttentionVariant describe() const;
  // Emits and verifies the IR; throws ir::ProgramError with the verifier's message if invalid.
  ir::Program build() const;

private:
  std::string name_;
  int head_dim_ = 128;
  int block_q_ = 128;
  int block_kv_ = 64;
  QkQuantization qk_;
  PvQuantization pv_;
  MaskKind mask_ = MaskKind::none;
  bool lse_ = false;
  SlaSpec sla_;
  bool packed_sequences_ = false;
};

// SLA's defaults (the paper's): k_h = 5%, k_l = 10%, phi = softmax. Use with .blocks(64, 64), the paper's b_q, b_kv.
SlaSpec sla_spec(FeatureMap feature_map = FeatureMap::softmax, double critical_percent = 5.0,
                 double negligible_percent = 10.0);

AttentionBuilder attention(std::string name = "custom");

// Emits the IR of an arbitrary variant (used by the builder and by tests of the verifier).
ir::Program emitProgram(const AttentionVariant &variant);

} // namespace sage::dsl
