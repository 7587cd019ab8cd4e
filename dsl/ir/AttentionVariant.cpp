// Names of the vocabulary enums: the same spellings as the sage dialect's keywords.
#include "sage/ir/AttentionVariant.h"

#include <array>
#include <stdexcept>
#include <utility>

namespace sage {
namespace {

template <typename Enum, size_t N> using NameTable = std::array<std::pair<Enum, std::string_view>, N>;

constexpr NameTable<ElementType, 8> kElementTypes{{{ElementType::f32, "f32"},
                                                   {ElementType::f16, "f16"},
                                                   {ElementType::bf16, "bf16"},
                                                   {ElementType::int8, "int8"},
                                                   {ElementType::int4, "int4"},
                                                   {ElementType::e4m3, "e4m3"},
                                                   {ElementType::e5m2, "e5m2"},
                                                   {ElementType::e2m1, "e2m1"}}};
constexpr NameTable<Granularity, 9> kGranularities{{{Granularity::none, "none"},
                                                    {Granularity::per_tensor, "per_tensor"},
                                                    {Granularity::per_token, "per_token"},
                                                    {Granularity::per_block, "per_block"},
                                                    {Granularity::per_warp, "per_warp"},
                                                    {Granularity::per_thread, "per_thread"},
                                                    {Granularity::per_channel, "per_channel"},
                                                    {Granularity::microscale_1x16, "microscale_1x16"},
                                                    {Granularity::microscale_1x32, "microscale_1x32"}}};
constexpr NameTable<ScaleType, 3> kScaleTypes{
    {{ScaleType::f32, "f32"}, {ScaleType::ue4m3, "ue4m3"}, {ScaleType::ue8m0, "ue8m0"}}};
constexpr NameTable<AccumulatorType, 3> kAccumulatorTypes{
    {{AccumulatorType::s32, "s32"}, {AccumulatorType::f16, "f16"}, {AccumulatorType::f32, "f32"}}};
constexpr NameTable<AccumulationKind, 4> kAccumulationKinds{{{AccumulationKind::f32, "f32"},
                                                             {AccumulationKind::f16, "f16"},
                                                             {AccumulationKind::f16_then_f32, "f16_then_f32"},
                                                             {AccumulationKind::f32_two_level, "f32_two_level"}}};
constexpr NameTable<MaskKind, 3> kMaskKinds{
    {{MaskKind::none, "none"}, {MaskKind::causal, "causal"}, {MaskKind::block_sparse, "block_sparse"}}};
constexpr NameTable<SmoothScope, 3> kSmoothScopes{
    {{SmoothScope::none, "none"}, {SmoothScope::sequence, "sequence"}, {SmoothScope::block, "block"}}};
constexpr NameTable<TensorRole, 4> kTensorRoles{
    {{TensorRole::q, "q"}, {TensorRole::k, "k"}, {TensorRole::v, "v"}, {TensorRole::p, "p"}}};

template <typename Enum, size_t N> std::string_view lookupName(const NameTable<Enum, N> &table, Enum value) {
  for (const auto &[entry, name] : table)
    if (entry == value)
      return name;
  return "<invalid>";
}

template <typename Enum, size_t N> std::optional<Enum> lookup(const NameTable<Enum, N> &table, std::string_view text) {
  for (const auto &[entry, name] : table)
    if (name == text)
      return entry;
  return std::nullopt;
}

} // namespace

std::string_view nameOf(ElementType type) { return lookupName(kElementTypes, type); }
std::string_view nameOf(Granularity granularity) { return lookupName(kGranularities, granularity); }
std::string_view nameOf(ScaleType type) { return lookupName(kScaleTypes, type); }
std::string_view nameOf(AccumulatorType type) { return lookupName(kAccumulatorTypes, type); }
std::string_view nameOf(AccumulationKind kind) { return lookupName(kAccumulationKinds, kind); }
std::string_view nameOf(MaskKind kind) { return lookupName(kMaskKinds, kind); }
std::string_view nameOf(SmoothScope scope) { return lookupName(kSmoothScopes, scope); }
std::string_view nameOf(TensorRole role) { return lookupName(kTensorRoles, role); }

std::optional<ElementType> parseElementType(std::string_view text) { return lookup(kElementTypes, text); }
std::optional<Granularity> parseGranularity(std::string_view text) { return lookup(kGranularities, text); }
std::optional<ScaleType> parseScaleType(std::string_view text) { return lookup(kScaleTypes, text); }
std::optional<AccumulatorType> parseAccumulatorType(std::string_view text) { return lookup(kAccumulatorTypes, text); }
std::optional<AccumulationKind> parseAccumulationKind(std::string_view text) {
  return lookup(kAccumulationKinds, text);
}
std::optional<MaskKind> parseMaskKind(std::string_view text) { return lookup(kMaskKinds, text); }
std::optional<SmoothScope> parseSmoothScope(std::string_view text) { return lookup(kSmoothScopes, text); }

int bitsOf(ElementType type) {
  switch (type) {
  case ElementType::f32:
    return 32;
  case ElementType::f16:
  case ElementType::bf16:
    return 16;
  case ElementType::int8:
  case ElementType::e4m3:
  case ElementType::e5m2:
    return 8;
  case ElementType::int4:
  case ElementType::e2m1:
    return 4;
  }
  return 0;
}

bool isInteger(ElementType type) { return type == ElementType::int8 || type == ElementType::int4; }
bool isFloat8(ElementType type) { return type == ElementType::e4m3 || type == ElementType::e5m2; }

bool slaSparsePartIsExact(const AttentionVariant &variant) {
  const auto f16 = [](const QuantizerSpec &spec) { return spec.dtype == ElementType::f16 && !spec.quantized(); };
  return f16(variant.q) && f16(variant.k) && f16(variant.p) && f16(variant.v) &&
         variant.smooth_q == SmoothScope::none && variant.smooth_k == SmoothScope::none &&
         variant.smooth_v == SmoothScope::none && variant.qk.accumulator == AccumulatorType::f32 &&
         variant.pv.accumulator == AccumulatorType::f32 && variant.accumulation.kind == AccumulationKind::f32;
}

AttentionVariant slaSparsePart(const AttentionVariant &variant) {
  AttentionVariant sparse = variant;
  sparse.sla = SlaSpec{};
  if (slaSparsePartIsExact(sparse))
    sparse.epilogue.write_lse = true; // L for the backward (SlaRunner passes null where the workspace has no room)
  return sparse;
}

std::string packedSequencesProblem(MaskKind mask, bool sla) {
  if (sla)
    return "packed_sequences: SLA is not built for packed batches yet (its mask prediction and linear branch pool and "
           "sum over one dense batch entry's tokens)";
  if (mask == MaskKind::block_sparse)
    return "packed_sequences: a block_sparse mask is given per dense batch entry ([batch, heads_q, q_blocks, "
           "kv_blocks]); it is not built for packed batches yet";
  return {};
}

AttentionVariant packedSequencesOf(const AttentionVariant &dense) {
  if (const std::string problem = packedSequencesProblem(dense.mask.kind, dense.sla.enabled); !problem.empty())
    throw std::invalid_argument("variant '" + dense.name + "': " + problem);
  AttentionVariant packed = dense;
  packed.packed_sequences = true;
  return packed;
}

} // namespace sage
