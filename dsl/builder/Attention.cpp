#include "sage/dsl/Attention.h"

#include <stdexcept>
#include <utility>

namespace sage::dsl {
namespace {

QuantizerSpec quantizer(ElementType dtype, Granularity granularity) {
  QuantizerSpec spec;
  spec.dtype = dtype;
  spec.granularity = granularity;
  return spec;
}

QuantizerSpec cast(ElementType dtype) { return quantizer(dtype, Granularity::none); }

bool usesGroups(Granularity granularity) {
  return granularity == Granularity::per_block || granularity == Granularity::per_warp ||
         granularity == Granularity::per_thread;
}

QuantizerSpec microscaled(Granularity granularity) {
  QuantizerSpec spec = quantizer(ElementType::e2m1, granularity);
  spec.scale_type = granularity == Granularity::microscale_1x16 ? ScaleType::ue4m3 : ScaleType::ue8m0;
  return spec;
}

QkQuantization fp4Qk(Granularity granularity) {
  QkQuantization spec;
  spec.q = microscaled(granularity);
  spec.q.fold_softmax_scale = true;
  spec.k = microscaled(granularity);
  return spec;
}

PvQuantization fp4Pv(Granularity granularity, bool two_level_p) {
  PvQuantization spec;
  spec.p = microscaled(granularity);
  spec.p.two_level = two_level_p;
  spec.v = microscaled(granularity);
  spec.mma_accumulator = AccumulatorType::f32;
  spec.accumulation = {AccumulationKind::f32, 0};
  return spec;
}

QkQuantization integerQk(ElementType dtype, Granularity granularity) {
  if (granularity == Granularity::per_channel || granularity == Granularity::none || isMicroscale(granularity))
    throw std::invalid_argument("qk granularity: expected per_tensor, per_token, per_block, per_warp or per_thread, "
                                "got '" +
                                std::string(nameOf(granularity)) + "'");
  QkQuantization spec;
  spec.q = quantizer(dtype, granularity);
  spec.q.fold_softmax_scale = true; // 1/sqrt(d) * log2(e) is folded into Q's quantization (paper 4.6)
  spec.k = quantizer(dtype, granularity);
  return spec;
}

} // namespace

QkQuantization &QkQuantization::smooth_k() {
  smooth_k_scope = SmoothScope::sequence;
  return *this;
}

QkQuantization &QkQuantization::smooth_q() {
  smooth_q_scope = SmoothScope::block;
  return *this;
}

QkQuantization &QkQuantization::rotate(uint32_t seed) {
  q.rotation_seed = seed;
  k.rotation_seed = seed;
  return *this;
}

QkQuantization &QkQuantization::groups(int q_group_tokens, int k_group_tokens) {
  if (q_group_tokens < 0 || k_group_tokens < 0)
    throw std::invalid_argument("groups: token counts must be >= 0 (0 means the whole tile)");
  q.group_tokens = q_group_tokens;
  k.group_tokens = k_group_tokens;
  return *this;
}

QkQuantization int8(Granularity granularity) { return integerQk(ElementType::int8, granularity); }
QkQuantization int4(Granularity granularity) { return integerQk(ElementType::int4, granularity); }

QkQuantization full_precision() {
  QkQuantization spec;
  spec.q = cast(ElementType::f32);
  spec.k = cast(ElementType::f32);
  return spec;
}

QkQuantization f16_qk() {
  QkQuantization spec;
  spec.q = cast(ElementType::f16);
  spec.k = cast(ElementType::f16);
  return spec;
}

QkQuantization nvfp4() { return fp4Qk(Granularity::microscale_1x16); }
QkQuantization mxfp4() { return fp4Qk(Granularity::microscale_1x32); }

PvQuantization &PvQuantization::smooth_v() {
  smooth_v_scope = SmoothScope::sequence;
  return *this;
}

PvQuantization &PvQuantization::flush_every(int kv_blocks) {
  if (kv_blocks <= 0)
    throw std::invalid_argument("flush_every: expected a positive number of KV blocks, got " +
                                std::to_string(kv_blocks));
  accumulation.flush_period = kv_blocks;
  return *this;
}

PvQuantization f16(AccumulationKind accumulation, int flush_period) {
  if (accumulation == AccumulationKind::f32_two_level)
    throw std::invalid_argument("f16 accumulation: expected accum::f16, accum::f32 or accum::f16_then_f32");
  PvQuantization spec;
  spec.p = cast(ElementType::f16);
  spec.v = cast(ElementType::f16);
  spec.mma_accumulator = accumulation == AccumulationKind::f32 ? AccumulatorType::f32 : AccumulatorType::f16;
  spec.accumulation = {accumulation, flush_period};
  return spec;
}

PvQuantization int8_pv() {
  PvQuantization spec;
  spec.p = quantizer(ElementType::int8, Granularity::per_tensor);
  spec.p.static_scale = 1.0 / 127.0; // rows of P~ have max 1 (paper 4.3)
  spec.v = quantizer(ElementType::int8, Granularity::per_channel);
  spec.mma_accumulator = AccumulatorType::s32;
  spec.accumulation = {AccumulationKind::f32, 0};
  return spec;
}

PvQuantization int8_pv_per_token_p() {
  PvQuantization spec;
  spec.p = quantizer(ElementType::int8, Granularity::per_token);
  spec.v = quantizer(ElementType::int8, Granularity::per_block); // group 0: the KV tile, resolved by describe()
  spec.mma_accumulator = AccumulatorType::s32;
  spec.accumulation = {AccumulationKind::f32, 0};
  return spec;
}

PvQuantization fp8_e4m3(AccumulationKind accumulation, int flush_period) {
  if (accumulation != AccumulationKind::f32 && accumulation != AccumulationKind::f32_two_level)
    throw std::invalid_argument("fp8_e4m3 accumulation: expected accum::f32 or accum::f32_two_level");
  PvQuantization spec;
  spec.p = quantizer(ElementType::e4m3, Granularity::per_tensor);
  spec.p.static_scale = 1.0 / 448.0; // P~ in [0, 1] mapped onto e4m3's largest finite value
  spec.v = quantizer(ElementType::e4m3, Granularity::per_channel);
  spec.mma_accumulator = AccumulatorType::f32;
  spec.accumulation = {accumulation, accumulation == AccumulationKind::f32_two_level ? flush_period : 0};
  return spec;
}

PvQuantization full_precision_pv() {
  PvQuantization spec;
  spec.p = cast(ElementType::f32);
  spec.v = cast(ElementType::f32);
  spec.mma_accumulator = AccumulatorType::f32;
  spec.accumulation = {AccumulationKind::f32, 0};
  return spec;
}

PvQuantization nvfp4_pv(bool two_level_p) { return fp4Pv(Granularity::microscale_1x16, two_level_p); }
PvQuantization mxfp4_pv() { return fp4Pv(Granularity::microscale_1x32, false); }

AttentionBuilder::AttentionBuilder(std::string name) : name_(std::move(name)) {
  qk_ = int8(Granularity::per_block).smooth_k();
  pv_ = f16(AccumulationKind::f16);
}

AttentionBuilder &AttentionBuilder::head_dim(int dimension) {
  if (dimension <= 0 || dimension % 16 != 0 || dimension > 256)
    throw std::invalid_argument("head_dim: expected a positive multiple of 16 up to 256, got " +
                                std::to_string(dimension));
  head_dim_ = dimension;
  return *this;
}

AttentionBuilder &AttentionBuilder::blocks(int block_q, int block_kv) {
  if (block_q <= 0 || block_q % 16 != 0 || block_kv <= 0 || block_kv % 16 != 0)
    throw std::invalid_argument("blocks: expected positive multiples of 16, got block_q=" + std::to_string(block_q) +
                                " block_kv=" + std::to_string(block_kv));
  block_q_ = block_q;
  block_kv_ = block_kv;
  return *this;
}

AttentionBuilder &AttentionBuilder::qk(const QkQuantization &spec) {
  qk_ = spec;
  return *this;
}

AttentionBuilder &AttentionBuilder::pv(const PvQuantization &spec) {
  pv_ = spec;
  return *this;
}

AttentionBuilder &AttentionBuilder::mask(MaskKind kind) {
  mask_ = kind;
  return *this;
}

AttentionBuilder &AttentionBuilder::lse(bool write) {
  lse_ = write;
  return *this;
}

AttentionBuilder &AttentionBuilder::name(std::string name) {
  name_ = std::move(name);
  return *this;
}

AttentionBuilder &AttentionBuilder::sla(const SlaSpec &spec) {
  sla_ = spec;
  sla_.enabled = true;
  return *this;
}

AttentionBuilder &AttentionBuilder::packed_sequences(bool packed) {
  packed_sequences_ = packed;
  return *this;
}

SlaSpec sla_spec(FeatureMap feature_map, double critical_percent, double negligible_percent) {
  SlaSpec spec;
  spec.enabled = true;
  spec.feature_map = feature_map;
  spec.critical_percent = critical_percent;
  spec.negligible_percent = negligible_percent;
  return spec;
}

AttentionVariant AttentionBuilder::describe() const {
  AttentionVariant variant;
  variant.name = name_;
  variant.head_dim = head_dim_;
  variant.block_q = block_q_;
  variant.block_kv = block_kv_;
  variant.smooth_q = qk_.smooth_q_scope;
  variant.smooth_k = qk_.smooth_k_scope;
  variant.smooth_v = pv_.smooth_v_scope;
  variant.q = qk_.q;
  variant.k = qk_.k;
  if (usesGroups(variant.q.granularity) && variant.q.group_tokens == 0)
    variant.q.group_tokens = block_q_;
  if (usesGroups(variant.k.granularity) && variant.k.group_tokens == 0)
    variant.k.group_tokens = block_kv_;
  variant.p = pv_.p;
  variant.v = pv_.v;
  if (variant.v.granularity == Granularity::per_block && variant.v.group_tokens == 0)
    variant.v.group_tokens = block_kv_; // one scale per KV tile: it factors out of the tile's P.V
  variant.qk = {variant.q.dtype, variant.k.dtype,
                isInteger(variant.q.dtype) ? AccumulatorType::s32 : AccumulatorType::f32};
  variant.pv = {variant.p.dtype, variant.v.dtype, pv_.mma_accumulator};
  variant.exp2_softmax = true;
  variant.accumulation = pv_.accumulation;
  variant.mask.kind = mask_;
  if (sla_.enabled) {
    if (mask_ != MaskKind::none && mask_ != MaskKind::block_sparse)
      throw std::invalid_argument("mask: an SLA variant's sparse part is block_sparse over the predicted critical "
                                  "blocks; expected no_mask or block_sparse, got '" +
                                  std::string(nameOf(mask_)) + "'");
    variant.mask.kind = MaskKind::block_sparse;
    variant.sla = sla_;
  }
  variant.epilogue.write_lse = lse_;
  variant.epilogue.lse_smoothing_correction = lse_ && variant.smooth_k != SmoothScope::none;
  return packed_sequences_ ? packedSequencesOf(variant) : variant;
}

ir::Program AttentionBuilder::build() const { return emitProgram(describe()); }

AttentionBuilder attention(std::string name) { return AttentionBuilder(std::move(name)); }

} // namespace sage::dsl
