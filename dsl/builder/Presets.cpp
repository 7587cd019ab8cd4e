// The named presets: SageAttention's Table 6 kernels, SageAttention2's FP8 P.V and an exact baseline; and the
// FP4/INT4 presets of SageAttention3 and SageAttention2, kept out of the default kernel set.
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
    // Q per warp of 16 rows (the rows one warp holds of a 64-row wgmma tile; SageAttention2's sm90 kernel uses the
    // same, and 32-row groups lost accuracy on Q outlier channels); every warp reads the whole K tile, so K's
    // per-warp group is the 64-token tile. The FP8 mma's accumulator is flushed into f32 every 2 blocks (128
    // tokens), as SageAttention2's kernels do: the tensor cores' FP8 accumulation keeps fewer mantissa bits than f32.
    builder.qk(int8(per_warp).groups(16, 64).smooth_k()).pv(fp8_e4m3(accum::f32_two_level, 2));
  else if (name == "sage-b-rot") // issue 28: Q and K rotated before their int8 quantizers (Q outlier channels)
    builder.qk(int8(per_block).smooth_k().rotate()).pv(f16(accum::f16));
  else if (name == "sage2-fp8-rot")
    builder.qk(int8(per_warp).groups(16, 64).smooth_k().rotate()).pv(fp8_e4m3(accum::f32_two_level, 2));
  else if (name == "sage3-fp4")
    builder.qk(nvfp4().smooth_q().smooth_k()).pv(nvfp4_pv());
  else if (name == "sage3-fp4-direct-p")
    builder.qk(nvfp4().smooth_q().smooth_k()).pv(nvfp4_pv(false));
  else if (name == "sage3-mxfp4")
    builder.qk(mxfp4().smooth_q().smooth_k()).pv(mxfp4_pv());
  else if (name == "sage2-int4")
    // Per-thread groups: a warp's 32 Q rows (a 128-row tile over 4 warps) and the 64-token K tile, each
    // interleaved by 8 as the m16n8k64 fragments hold them.
    builder.qk(int4(per_thread).groups(32, 64).smooth_q().smooth_k()).pv(fp8_e4m3(accum::f32_two_level, 2));
  else if (name == "sla-f16") // SLA's sparse part exact in f16 (the paper's kernel)
    builder.blocks(64, 64).qk(f16_qk()).pv(f16(accum::f32)).sla(sla_spec());
  else if (name == "sla-int8") // SLA's sparse part through SageAttention's int8 Q.K^T with K smoothing
    builder.blocks(64, 64).qk(int8(per_block).smooth_k()).pv(f16(accum::f32)).sla(sla_spec());
  else if (name == "sla-f16-elu")
    builder.blocks(64, 64).qk(f16_qk()).pv(f16(accum::f32)).sla(sla_spec(FeatureMap::elu_plus_one));
  else if (name == "sagebwd")
    // SageBwd's forward (SageAttention3, Algorithm 2): per-block int8 Q/K (K smoothed), per-token int8 P reusing
    // the softmax's max, per-block int8 V; the LSE is saved for the backward.
    builder.qk(int8(per_block).smooth_k()).pv(int8_pv_per_token_p()).lse();
  else if (name == "sage2-int4-no-smooth-q")
    builder.qk(int4(per_thread).groups(32, 64).smooth_k()).pv(fp8_e4m3(accum::f32_two_level, 2));
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

const std::vector<PresetInfo> &referenceOnlyPresets() {
  static const std::vector<PresetInfo> table = {
      {"sage3-fp4", "SageAttention3: NVFP4 Q/K/P/V (1x16, UE4M3), Q and K smoothed, two-level P, f32 accumulation"},
      {"sage3-fp4-direct-p", "sage3-fp4 with P~ microscaled directly (no per-row scale): Table 1(b)'s ablation"},
      {"sage3-mxfp4", "sage3-fp4 in MXFP4 (1x32, UE8M0 scales), P direct: Table 1(a)'s ablation"},
      {"sage2-int4", "SageAttention2: int4 per-thread Q/K, Q and K smoothed; e4m3 P.V, two-level f32"},
      {"sage2-int4-no-smooth-q", "sage2-int4 without Q smoothing (the ablation)"},
      {"sagebwd", "SageBwd's forward (Algorithm 2): int8 per-block Q/K/V, K smoothed; int8 per-token P; LSE saved"},
  };
  return table;
}

const std::vector<PresetInfo> &rotatedPresets() {
  static const std::vector<PresetInfo> table = {
      {"sage-b-rot", "sage-b with Q and K rotated along d (randomized Hadamard) before quantization: outlier channels"},
      {"sage2-fp8-rot", "sage2-fp8 with Q and K rotated along d (randomized Hadamard) before quantization"},
  };
  return table;
}

const std::vector<PresetInfo> &slaPresets() {
  static const std::vector<PresetInfo> table = {
      {"sla-f16", "SLA: predicted critical blocks exact (f16 Q/K/P/V, f32 accumulation), marginal ones linear "
                  "(phi = softmax), k_h 5%, k_l 10%, 64x64 blocks"},
      {"sla-int8", "sla-f16 with int8 per-block Q.K^T and K smoothing in the critical blocks"},
      {"sla-f16-elu", "sla-f16 with phi = elu + 1 (the paper's ablation)"},
  };
  return table;
}

std::optional<AttentionBuilder> preset(std::string_view name, int head_dim, MaskKind mask) {
  for (const std::vector<PresetInfo> *table : {&presets(), &referenceOnlyPresets(), &rotatedPresets(), &slaPresets()})
    for (const PresetInfo &info : *table)
      if (info.name == name) {
        AttentionBuilder builder = makePreset(name);
        builder.head_dim(head_dim).mask(mask);
        return builder;
      }
  return std::nullopt;
}

} // namespace sage::dsl
