// The DSL of the backward pass (SageBwd, issue 12): builds a `sage.attention_backward` program.
//
//   using namespace sage::dsl;
//   ir::BackwardProgram program = attention_backward("mine").head_dim(128).mask(causal).build();
//
// By default it is SageAttention3's Algorithm 3: S = Q.K^T, dV = P^T.dO, dQ = dS.K and dK = dS^T.Q in int8 with
// per-block scales (Q and dO per b_q tokens, K per b_kv tokens, P and dS per b_q x b_kv tile), dP = dO.V^T in f16,
// everything accumulated in f32. Q and K codes are shared by S and dK / dQ, as the algorithm reuses the forward's.
// K is smoothed (K - mean(K) per KV head, with the LSE shifted to match: issue 25) unless smooth_k(false).
#pragma once

#include "sage/dsl/Presets.h"
#include "sage/ir/BackwardProgram.h"
#include "sage/ir/BackwardVariant.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sage::dsl {

class AttentionBackwardBuilder {
public:
  explicit AttentionBackwardBuilder(std::string name);

  AttentionBackwardBuilder &head_dim(int dimension);
  AttentionBackwardBuilder &blocks(int block_q, int block_kv); // b_q, b_kv
  AttentionBackwardBuilder &mask(MaskKind kind);               // none or causal
  // dP = dO.V^T in int8 per-block too (the paper's Table 1(c) ablation); default f16.
  AttentionBackwardBuilder &quantize_dp(bool int8 = true);
  // The type of unquantized operands (dP's in SageBwd): f16 (default) or bf16, as the caller's tensors.
  AttentionBackwardBuilder &float_type(ElementType type);
  // Every product in f32, no quantization: the exact backward run through the same program (tests).
  AttentionBackwardBuilder &full_precision();
  // S and dQ from K - mean(K) (the mean per KV head over the sequence) and P from the LSE shifted by
  // q . mean(K) / sqrt(d): SageAttention's K smoothing in the backward. Default on; off is the ablation.
  AttentionBackwardBuilder &smooth_k(bool smoothed = true);
  // Q and K rotated along d by a randomized Hadamard transform before their int8 quantizers (issue 25, as the
  // forward's QkQuantization::rotate): for Q outlier channels. S, dQ and dK share the rotated codes; the kernels
  // rotate dQ and dK back. Needs a power-of-two head_dim; a full-precision backward has nothing to rotate.
  AttentionBackwardBuilder &rotate(uint32_t seed = kDefaultRotationSeed);
  // P and dS in int8 with one scale per token of their product's output instead of one per tile (issue 25): per key
  // for dV = P^T.dO and dK = dS^T.Q (`per_key`), per query for dQ = dS.K (`per_query`; dS is then quantized twice).
  // The scales factor out of each product's sum and keep the small probabilities of a sharp softmax that a tile-wide
  // 1/127 step zeroes.
  AttentionBackwardBuilder &token_scales(bool per_key = true, bool per_query = true);
  AttentionBackwardBuilder &name(std::string name);

  BackwardVariant describe() const;
  ir::BackwardProgram build() const; // throws ir::ProgramError with the verifier's message if invalid

private:
  std::string name_;
  int head_dim_ = 128;
  int block_q_ = 64;
  int block_kv_ = 64;
  MaskKind mask_ = MaskKind::none;
  bool int8_dp_ = false;
  bool full_precision_ = false;
  bool smooth_k_ = true;
  bool key_scales_ = false, query_scales_ = false;
  std::optional<uint32_t> rotation_seed_;
  ElementType float_type_ = ElementType::f16;
};

AttentionBackwardBuilder attention_backward(std::string name = "custom_backward");

// Emits the IR of an arbitrary backward variant (the builder's, and tests' of the verifier). Operands with equal
// quantizers share one sage.bwd_quantize (Q and K codes feed S and dK / dQ).
ir::BackwardProgram emitBackwardProgram(const BackwardVariant &variant);

// The backward presets: "sagebwd" (Algorithm 3, K smoothed), "sagebwd-rot" (sagebwd with Q and K rotated: Q outlier
// channels), "sagebwd-rot-ks" (sagebwd-rot with P and dS scaled per key for dV and dK, issue 25), "sagebwd-rot-qks"
// (sagebwd-rot-ks with dS scaled per query for dQ too), "sagebwd-int8-dp" (dO.V^T quantized too, Table 1(c)'s
// ablation), "exact-bwd" (f32 throughout, K as given). Each pairs with a forward preset (backwardPresetForward); a
// rotating backward with a rotated forward.
const std::vector<PresetInfo> &backwardPresets();
std::optional<AttentionBackwardBuilder> backwardPreset(std::string_view name, int head_dim = 128,
                                                       MaskKind mask = MaskKind::none);
// The forward preset whose O and LSE a backward preset consumes: "sagebwd" (Algorithm 2) or "exact". For a rotating
// backward (sagebwd-rot) the forward is to be rotated with the backward's seed (Q's rotation_seed of its S product).
std::string_view backwardPresetForward(std::string_view backward_name);
// The backward preset that pairs with a forward preset for training: "sagebwd-rot" for the rotated forward presets
// (rotatedPresets(): the rotation pays where Q has outlier channels, in both passes), "sagebwd" otherwise.
std::string_view backwardPresetFor(std::string_view forward_preset);

} // namespace sage::dsl
