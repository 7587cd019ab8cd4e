#include "sage/dsl/AttentionBackward.h"

#include <stdexcept>
#include <utility>

namespace sage::dsl {
namespace {

QuantizerSpec cast(ElementType dtype) {
  QuantizerSpec spec;
  spec.dtype = dtype;
  return spec;
}

// int8 with one scale per `group_tokens` tokens (0: one per P/dS tile).
QuantizerSpec int8PerBlock(int group_tokens) {
  QuantizerSpec spec;
  spec.dtype = ElementType::int8;
  spec.granularity = Granularity::per_block;
  spec.group_tokens = group_tokens;
  return spec;
}

BackwardProductSpec product(QuantizerSpec lhs, QuantizerSpec rhs) {
  const AccumulatorType accumulator = lhs.dtype == ElementType::int8 ? AccumulatorType::s32 : AccumulatorType::f32;
  return {lhs, rhs, accumulator};
}

} // namespace

AttentionBackwardBuilder::AttentionBackwardBuilder(std::string name) : name_(std::move(name)) {}

AttentionBackwardBuilder &AttentionBackwardBuilder::head_dim(int dimension) {
  if (dimension <= 0 || dimension % 16 != 0 || dimension > kMaxHeadDim)
    throw std::invalid_argument("head_dim: expected a positive multiple of 16 up to " + std::to_string(kMaxHeadDim) +
                                ", got " + std::to_string(dimension));
  head_dim_ = dimension;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::blocks(int block_q, int block_kv) {
  for (auto [name, value] : {std::pair{"block_q", block_q}, std::pair{"block_kv", block_kv}})
    if (value <= 0 || value % 16 != 0 || value > kMaxBlockTokens)
      throw std::invalid_argument(std::string("blocks: ") + name + " must be a positive multiple of 16 up to " +
                                  std::to_string(kMaxBlockTokens) + ", got " + std::to_string(value));
  block_q_ = block_q;
  block_kv_ = block_kv;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::mask(MaskKind kind) {
  if (kind == MaskKind::block_sparse)
    throw std::invalid_argument("mask: the backward supports none and causal, not block_sparse");
  mask_ = kind;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::quantize_dp(bool int8) {
  int8_dp_ = int8;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::float_type(ElementType type) {
  if (type != ElementType::f16 && type != ElementType::bf16)
    throw std::invalid_argument("float_type: expected f16 or bf16, got '" + std::string(nameOf(type)) + "'");
  float_type_ = type;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::full_precision() {
  full_precision_ = true;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::smooth_k(bool smoothed) {
  smooth_k_ = smoothed;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::rotate(uint32_t seed) {
  rotation_seed_ = seed;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::token_scales(bool per_key, bool per_query) {
  key_scales_ = per_key;
  query_scales_ = per_query;
  return *this;
}

AttentionBackwardBuilder &AttentionBackwardBuilder::name(std::string name) {
  name_ = std::move(name);
  return *this;
}

BackwardVariant AttentionBackwardBuilder::describe() const {
  BackwardVariant variant;
  variant.name = name_;
  variant.head_dim = head_dim_;
  variant.block_q = block_q_;
  variant.block_kv = block_kv_;
  variant.mask = mask_;
  variant.smooth_k = smooth_k_ ? SmoothScope::sequence : SmoothScope::none;
  if (full_precision_) {
    if (rotation_seed_)
      throw std::invalid_argument("rotate: a full-precision backward quantizes nothing; the rotation protects the "
                                  "int8 quantizers of Q and K from outlier channels");
    for (BackwardProduct which : kBackwardProducts)
      variant.product(which) = product(cast(ElementType::f32), cast(ElementType::f32));
    return variant;
  }
  QuantizerSpec q = int8PerBlock(block_q_), k = int8PerBlock(block_kv_);
  q.rotation_seed = k.rotation_seed = rotation_seed_; // one rotation, shared by S, dQ and dK
  const QuantizerSpec d_o = int8PerBlock(block_q_), v = int8PerBlock(block_kv_);
  // P and dS: one scale per b_q x b_kv tile, or per token of the product's output (token_scales)
  const QuantizerSpec tile = int8PerBlock(0), per_token{ElementType::int8, Granularity::per_token, 0};
  variant.product(BackwardProduct::s) = product(q, k);
  variant.product(BackwardProduct::dp) =
      int8_dp_ ? product(d_o, v) : product(cast(float_type_), cast(float_type_)); // Algorithm 3 line 8: FP16
  variant.product(BackwardProduct::dv) = product(key_scales_ ? per_token : tile, d_o);
  variant.product(BackwardProduct::dq) = product(query_scales_ ? per_token : tile, k);
  variant.product(BackwardProduct::dk) = product(key_scales_ ? per_token : tile, q);
  return variant;
}

ir::BackwardProgram AttentionBackwardBuilder::build() const { return emitBackwardProgram(describe()); }

AttentionBackwardBuilder attention_backward(std::string name) { return AttentionBackwardBuilder(std::move(name)); }

const std::vector<PresetInfo> &backwardPresets() {
  static const std::vector<PresetInfo> table = {
      {"sagebwd", "SageBwd (Algorithm 3): int8 per-block S, dV, dQ, dK with K smoothed (K - mean(K), the LSE shifted "
                  "to match); dO.V^T in f16; f32 accumulation"},
      {"sagebwd-rot", "sagebwd with Q and K rotated along d (randomized Hadamard) before quantization, dQ and dK "
                      "rotated back: Q outlier channels (pairs with the rotated forward presets)"},
      {"sagebwd-rot-ks",
       "sagebwd-rot with P (for dV) and dS (for dK) in int8 with one scale per key instead of one per "
       "64x64 tile (issue 25: token_scales(true, false); both backward kernels)"},
      {"sagebwd-rot-qks", "sagebwd-rot-ks with dS for dQ in int8 with one scale per query of the 64-key block too "
                          "(issue 25: token_scales(true, true); both backward kernels)"},
      {"sagebwd-int8-dp", "sagebwd with dO.V^T in int8 per-block too: Table 1(c)'s ablation"},
      {"exact-bwd", "the backward in f32 throughout, K unsmoothed (the accuracy baseline)"},
  };
  return table;
}

std::optional<AttentionBackwardBuilder> backwardPreset(std::string_view name, int head_dim, MaskKind mask) {
  AttentionBackwardBuilder builder = attention_backward(std::string(name));
  if (name == "sagebwd-int8-dp")
    builder.quantize_dp();
  else if (name == "sagebwd-rot")
    builder.rotate();
  else if (name == "sagebwd-rot-ks")
    builder.rotate().token_scales(true, false);
  else if (name == "sagebwd-rot-qks")
    builder.rotate().token_scales(true, true);
  else if (name == "exact-bwd")
    builder.full_precision().smooth_k(false);
  else if (name != "sagebwd")
    return std::nullopt;
  builder.head_dim(head_dim).mask(mask);
  return builder;
}

std::string_view backwardPresetForward(std::string_view backward_name) {
  return backward_name == "exact-bwd" ? "exact" : "sagebwd";
}

std::string_view backwardPresetFor(std::string_view forward_preset) {
  for (const PresetInfo &info : rotatedPresets())
    if (info.name == forward_preset)
      return "sagebwd-rot";
  return "sagebwd";
}

} // namespace sage::dsl
