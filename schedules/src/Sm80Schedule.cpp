// The sm80 mma.sync schedule: what it supports and how it tiles a variant.
#include "sage/schedules/Sm80Schedule.h"
#include "PipelineStages.h"

#include "sage/schedules/GpuLimits.h"
#include "sage/schedules/PackedSequences.h"
#include "sage/schedules/PrologueHeadDim.h"
#include "sage/schedules/PrologueRotation.h"

#include "sage/ir/AttentionVariant.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::schedules {
namespace {

constexpr int kWarpSize = 32;
constexpr int kMmaRows = 16;         // every mma.sync shape used here is m16
constexpr int kKvTokenQuantum = 32;  // the k extent of the 8-bit P.V mma: b_kv must be a multiple
constexpr int kMaxRowsPerWarp = 64;  // beyond this the S and O fragments no longer fit in registers
constexpr int kMaxBlockKv = 128;     // S of one warp (rows x b_kv f32) must stay in registers
constexpr int kMinStages = 2;        // one tile computing, one loading
constexpr int kMinDefaultStages = 3; // default plans keep at least this deep a pipeline for occupancy
constexpr int kMaxStages = 6;
constexpr int kMinHeadDim = 32;          // one k32 step of the int8 Q.K^T mma
constexpr int kMaxHeadDim = 256;         // O_i in f32 is d / 2 registers per thread for 16 rows per warp
constexpr int kMaxTwoLevelHeadDim = 128; // two f32 copies of O: see headDimSupport
constexpr int kRegionAlignment = 128;    // keeps every swizzled tile on a 128-byte bank line
constexpr int kTargetBlocksPerMultiprocessor = 2;
// Addresses, indices and loop state on top of the fragments. Calibrated on H100 (sage-b d128, 8 warps): two CTAs
// per SM at 128 registers (a few spills) ran at 441 TOPS against 380 TOPS for one CTA at 168 registers.
constexpr int kBaseRegisters = 32;

std::string typeName(ElementType type) { return std::string(nameOf(type)); }

std::string granularityName(Granularity granularity) { return std::string(nameOf(granularity)); }

bool isFloatCast(const QuantizerSpec &spec) {
  return !spec.quantized() &&
         (spec.dtype == ElementType::f16 || spec.dtype == ElementType::bf16 || spec.dtype == ElementType::f32);
}

// Q or K quantized to int8 codes with one f32 scale per group of tokens.
SupportResult checkQkQuantizer(const QuantizerSpec &spec, std::string_view role, int block_tokens) {
  const std::string who(role);
  if (spec.dtype == ElementType::e2m1)
    return SupportResult::no(who + " codes are e2m1 (FP4): the sm80 schedule emulates FP4 only when Q, K, P and V are "
                                   "all microscaled e2m1");
  // int4 runs as the legalized s4 -> s8 program: int4 codes stored one per byte, multiplied by the int8 mma.
  if (spec.dtype != ElementType::int8 && spec.dtype != ElementType::int4)
    return SupportResult::no(who + " codes are " + typeName(spec.dtype) +
                             ": the sm80 schedule multiplies int8 codes (m16n8k32 s8; int4 decoded to int8) or "
                             "unquantized f16/bf16/f32");
  if (spec.scale_type != ScaleType::f32 || spec.two_level)
    return SupportResult::no(who + ": ue4m3 and two-level scales (microscaling) are not in the sm80 schedule");
  if (spec.static_scale > 0.0)
    return SupportResult::no(who + ": a static scale is only supported for P");
  switch (spec.granularity) {
  case Granularity::per_tensor:
  case Granularity::per_token:
    return SupportResult::yes();
  case Granularity::per_block:
  case Granularity::per_warp:
  case Granularity::per_thread:
    break;
  default:
    return SupportResult::no(who + " granularity " + granularityName(spec.granularity) +
                             " is not a token grouping the sm80 schedule supports");
  }
  const int group = spec.group_tokens > 0 ? spec.group_tokens : block_tokens; // 0: the whole tile
  if (spec.group_tokens < 0)
    return SupportResult::no(who + ": group_tokens must be >= 0 (0: the tile), got " +
                             std::to_string(spec.group_tokens));
  if (spec.granularity == Granularity::per_thread && group % 8 != 0)
    return SupportResult::no(who +
                             ": per_thread groups interleave tokens by 8, so group_tokens must be a multiple "
                             "of 8 (got " +
                             std::to_string(group) + ")");
  if (role == "K" && group % block_tokens != 0 && block_tokens % group != 0)
    return SupportResult::no("K: group_tokens " + std::to_string(group) + " must divide or be a multiple of block_kv " +
                             std::to_string(block_tokens));
  return SupportResult::yes();
}

SupportResult checkQk(const AttentionVariant &variant, const Sm80Schedule::Extensions &extensions) {
  if (!extensions.q_smoothing_and_int4) {
    if (variant.smooth_q != SmoothScope::none)
      return SupportResult::no("Q smoothing (SageAttention2) adds mean(Q_block).K^T to S: only the sm80 kernel "
                               "writer adds the prologue's delta_s");
    if (variant.q.dtype == ElementType::int4 || variant.k.dtype == ElementType::int4)
      return SupportResult::no("int4 Q/K: only the sm80 kernel writer runs them (decoded to int8)");
  }
  if (variant.smooth_q == SmoothScope::sequence)
    return SupportResult::no("Q smoothing over the sequence is not supported (only per Q block, SageAttention2)");
  if (variant.smooth_k == SmoothScope::block)
    return SupportResult::no("K smoothing per block is not supported (only over the sequence)");
  const bool float_q = isFloatCast(variant.q), float_k = isFloatCast(variant.k);
  if (float_q != float_k)
    return SupportResult::no("Q and K must both be quantized (int8 or int4) or both unquantized");
  if (variant.smooth_q == SmoothScope::block && float_q)
    return SupportResult::no("Q smoothing needs a quantized Q (its correction is added to the dequantized S)");
  if (float_q) {
    if (variant.qk.accumulator != AccumulatorType::f32)
      return SupportResult::no("unquantized Q.K^T accumulates in f32 on the GPU");
    return SupportResult::yes();
  }
  if (SupportResult q = checkQkQuantizer(variant.q, "Q", variant.block_q); !q)
    return q;
  if (SupportResult k = checkQkQuantizer(variant.k, "K", variant.block_kv); !k)
    return k;
  if (variant.q.dtype != variant.k.dtype)
    return SupportResult::no("Q and K codes must have one type (both int8 or both int4)");
  if (variant.qk.accumulator != AccumulatorType::s32)
    return SupportResult::no("int8 Q.K^T accumulates in s32 (mma m16n8k32 s8.s8.s32)");
  return SupportResult::yes();
}

bool fp4Operand(const QuantizerSpec &spec, Granularity granularity, ScaleType scale) {
  return spec.dtype == ElementType::e2m1 && spec.granularity == granularity && spec.scale_type == scale &&
         spec.static_scale <= 0.0;
}

bool anyFp4(const AttentionVariant &variant) {
  return variant.q.dtype == ElementType::e2m1 || variant.k.dtype == ElementType::e2m1 ||
         variant.p.dtype == ElementType::e2m1 || variant.v.dtype == ElementType::e2m1;
}

// FP4 by emulation, as the legalization rewrites the program for a target without the block-scaled mma: each operand's
// e2m1 codes times its microscales decoded exactly (fp4DecodedType: f16 for NVFP4, bf16 for MXFP4), then the 16-bit
// mma.sync with f32 accumulation. P is microscaled in registers exactly as the reference's quantizeProbabilities.
SupportResult checkFp4(const AttentionVariant &variant, GpuArch arch, const Sm80Schedule::Extensions &extensions) {
  if (!extensions.fp4_emulation)
    return SupportResult::no("e2m1 (FP4) operands: only the sm80 kernel writer emulates FP4 (decoded to f16/bf16 for "
                             "a 16-bit mma.sync, see `sagegen ir --legalize`)");
  // The legalization decodes FP4 only for a target without the block-scaled mma; the emulation runs that program.
  if (hasFp4BlockScaledMma(arch))
    return SupportResult::no(std::string(archName(arch)) +
                             " multiplies FP4 natively (block-scaled mma): its legalized program has no sage.decode, "
                             "which is what the sm80 schedule emulates (on sm_80, sm_86, sm_89, sm_90a)");
  const bool nvfp4 = fp4Operand(variant.q, Granularity::microscale_1x16, ScaleType::ue4m3);
  const bool mxfp4 = fp4Operand(variant.q, Granularity::microscale_1x32, ScaleType::ue8m0);
  if (!nvfp4 && !mxfp4)
    return SupportResult::no("FP4 emulation: Q must be e2m1 with microscale_1x16 ue4m3 (NVFP4) or microscale_1x32 "
                             "ue8m0 (MXFP4) scales, got " +
                             typeName(variant.q.dtype) + " " + granularityName(variant.q.granularity));
  const Granularity granularity = variant.q.granularity;
  const ScaleType scale = variant.q.scale_type;
  const std::string format = nvfp4 ? "NVFP4 (e2m1, microscale_1x16, ue4m3)" : "MXFP4 (e2m1, microscale_1x32, ue8m0)";
  if (!fp4Operand(variant.k, granularity, scale))
    return SupportResult::no("FP4 emulation: K must be quantized as Q: " + format);
  if (!fp4Operand(variant.p, granularity, scale))
    return SupportResult::no("FP4 emulation: P must be quantized as Q and K: " + format);
  if (!fp4Operand(variant.v, granularity, scale))
    return SupportResult::no("FP4 emulation: V must be quantized as Q and K: " + format + ", along the tokens");
  if (variant.q.two_level || variant.k.two_level || variant.v.two_level)
    return SupportResult::no("FP4 emulation: only P has a two-level scale (s_P1 per row)");
  if (variant.qk.a != ElementType::e2m1 || variant.qk.b != ElementType::e2m1 ||
      variant.qk.accumulator != AccumulatorType::f32 || variant.pv.a != ElementType::e2m1 ||
      variant.pv.b != ElementType::e2m1 || variant.pv.accumulator != AccumulatorType::f32)
    return SupportResult::no("FP4 emulation: both matmuls must be e2m1 x e2m1 with an f32 accumulator");
  if (variant.accumulation.kind != AccumulationKind::f32)
    return SupportResult::no("FP4 emulation: accumulation must be f32, got " +
                             std::string(nameOf(variant.accumulation.kind)));
  if (variant.smooth_v != SmoothScope::none)
    return SupportResult::no("FP4 emulation: smoothed V is not supported (no FP4 preset smooths V)");
  if (variant.smooth_q == SmoothScope::sequence)
    return SupportResult::no("Q smoothing over the sequence is not supported (only per Q block, SageAttention2)");
  if (variant.smooth_k == SmoothScope::block)
    return SupportResult::no("K smoothing per block is not supported (only over the sequence)");
  return SupportResult::yes();
}

bool staticallyScaled(const QuantizerSpec &spec) {
  return spec.static_scale > 0.0 && !spec.two_level && spec.scale_type == ScaleType::f32 &&
         (spec.granularity == Granularity::per_tensor || spec.granularity == Granularity::none);
}

bool perChannel(const QuantizerSpec &spec, ElementType dtype) {
  return spec.dtype == dtype && spec.granularity == Granularity::per_channel && spec.scale_type == ScaleType::f32 &&
         !spec.two_level && spec.static_scale <= 0.0;
}

SupportResult checkPv(const AttentionVariant &variant, GpuArch arch) {
  const QuantizerSpec &p = variant.p, &v = variant.v;
  const AccumulationKind accumulation = variant.accumulation.kind;
  const bool two_level =
      accumulation == AccumulationKind::f16_then_f32 || accumulation == AccumulationKind::f32_two_level;
  if (two_level && variant.accumulation.flush_period <= 0)
    return SupportResult::no("two-level accumulation needs a positive flush_period");
  if (variant.smooth_v == SmoothScope::block)
    return SupportResult::no("V smoothing per block is not supported (only over the sequence)");

  if (!p.quantized() && !v.quantized()) {
    if (p.dtype == ElementType::bf16 || v.dtype == ElementType::bf16)
      return SupportResult::no("bf16 P.V is not in the sm80 schedule (P and V are f16 on the GPU)");
    if (p.dtype == ElementType::f16 && v.dtype == ElementType::f16) {
      if (variant.pv.accumulator == AccumulatorType::f16 &&
          (accumulation == AccumulationKind::f16 || accumulation == AccumulationKind::f16_then_f32))
        return SupportResult::yes();
      if (variant.pv.accumulator == AccumulatorType::f32 && accumulation == AccumulationKind::f32)
        return SupportResult::yes();
      return SupportResult::no("f16 P.V: expected an f16 accumulator (accumulation f16 or f16_then_f32) or an f32 "
                               "accumulator (accumulation f32)");
    }
    if (p.dtype == ElementType::f32 && v.dtype == ElementType::f32) {
      // The exact preset: P is rounded to f16 on the GPU (there is no f32 mma); accumulation stays f32.
      if (variant.pv.accumulator == AccumulatorType::f32 && accumulation == AccumulationKind::f32)
        return SupportResult::yes();
      return SupportResult::no("f32 P.V runs as f16 x f16 with an f32 accumulator: accumulation must be f32");
    }
    return SupportResult::no("P.V with P " + typeName(p.dtype) + " and V " + typeName(v.dtype) +
                             " is not supported (expected both f16 or both f32)");
  }
  if (p.dtype == ElementType::int8 && v.dtype == ElementType::int8) {
    if (!staticallyScaled(p))
      return SupportResult::no("int8 P needs a static scale (e.g. 1/127): dynamic P scales are not supported");
    if (!perChannel(v, ElementType::int8))
      return SupportResult::no("int8 V must be quantized per_channel with f32 scales");
    if (variant.pv.accumulator != AccumulatorType::s32 || accumulation != AccumulationKind::f32)
      return SupportResult::no("int8 P.V accumulates in s32 per KV block, then in f32 (accumulation f32)");
    return SupportResult::yes();
  }
  if (p.dtype == ElementType::e4m3 && v.dtype == ElementType::e4m3) {
    if (!hasFp8MmaSync(arch))
      return SupportResult::no("e4m3 P.V needs mma.sync m16n8k32 e4m3 (sm_89 or newer); " +
                               std::string(archName(arch)) + " has none");
    if (!staticallyScaled(p))
      return SupportResult::no("e4m3 P needs a static scale (e.g. 1/448): dynamic P scales are not supported");
    if (!perChannel(v, ElementType::e4m3))
      return SupportResult::no("e4m3 V must be quantized per_channel with f32 scales");
    if (variant.pv.accumulator != AccumulatorType::f32 ||
        (accumulation != AccumulationKind::f32 && accumulation != AccumulationKind::f32_two_level))
      return SupportResult::no("e4m3 P.V accumulates in f32 (accumulation f32 or f32_two_level)");
    return SupportResult::yes();
  }
  if (p.dtype == ElementType::e2m1 || v.dtype == ElementType::e2m1 || p.granularity == Granularity::microscale_1x16 ||
      v.granularity == Granularity::microscale_1x16)
    return SupportResult::no("FP4 microscaled P.V (e2m1, 1x16 ue4m3 scales) needs the block-scaled mma of sm_100f/"
                             "sm_120f: not the sm80 schedule");
  return SupportResult::no("P.V with P " + typeName(p.dtype) + " and V " + typeName(v.dtype) +
                           " is not supported (expected f16/f16, f32/f32, int8/int8 or e4m3/e4m3)");
}

// A multiple of the 8-bit P.V's k (32) whose V^T rows are a power-of-two number of 16-byte chunks.
bool validBlockKv(int block_kv) {
  return block_kv == kKvTokenQuantum || block_kv == 2 * kKvTokenQuantum || block_kv == kMaxBlockKv;
}

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

void validateTunables(const Tunables &tunables, const AttentionVariant &variant) {
  require(!tunables.inline_loads, "tunables.inline_loads: the sm80 schedule has no producer warps (every warp loads "
                                  "its tiles with cp.async): expected 0");
  require(tunables.ctas == 0, "tunables.ctas: only the sm90 schedule's inline loads take a CTA count, expected none, "
                              "got " +
                                  std::to_string(tunables.ctas));
  // cp.async copies advance whole 8-row swizzle groups per pass, which 128+ threads guarantee for every tile.
  require(tunables.warps == 4 || tunables.warps == 8 || tunables.warps == 16,
          "tunables.warps: expected 4, 8 or 16, got " + std::to_string(tunables.warps));
  require(tunables.block_q > 0 && tunables.block_q % (kMmaRows * tunables.warps) == 0,
          "tunables.block_q: expected a positive multiple of 16 * warps (" + std::to_string(kMmaRows * tunables.warps) +
              "), got " + std::to_string(tunables.block_q));
  require(tunables.block_q / tunables.warps <= kMaxRowsPerWarp,
          "tunables.block_q: at most " + std::to_string(kMaxRowsPerWarp) + " rows per warp, got " +
              std::to_string(tunables.block_q / tunables.warps));
  require(validBlockKv(tunables.block_kv),
          "tunables.block_kv: expected 32, 64 or 128, got " + std::to_string(tunables.block_kv));
  // The prologue pads Q and K/V to the variant's blocks: a schedule block must tile that padding exactly.
  require(variant.block_q % tunables.block_q == 0,
          "tunables.block_q: must divide the variant's block_q " + std::to_string(variant.block_q) +
              " (the workspace pads Q to it), got " + std::to_string(tunables.block_q));
  require(variant.block_kv % tunables.block_kv == 0,
          "tunables.block_kv: must divide the variant's block_kv " + std::to_string(variant.block_kv) +
              " (the workspace pads K and V to it), got " + std::to_string(tunables.block_kv));
  require(tunables.stages >= kMinStages && tunables.stages <= kMaxStages,
          "tunables.stages: expected " + std::to_string(kMinStages) + ".." + std::to_string(kMaxStages) + ", got " +
              std::to_string(tunables.stages));
  // FP4 P's two-level scale is taken per row of one S tile: another tile width quantizes P otherwise than the
  // reference.
  if (variant.p.dtype == ElementType::e2m1)
    require(tunables.block_kv == variant.block_kv,
            "tunables.block_kv: FP4 P is quantized per S tile, so it must be the variant's block_kv " +
                std::to_string(variant.block_kv) + ", got " + std::to_string(tunables.block_kv));
  if (variant.mask.kind == MaskKind::block_sparse)
    require(tunables.block_q == variant.block_q && tunables.block_kv == variant.block_kv,
            "tunables.block_q/block_kv: a block_sparse variant's block mask is in units of its own blocks (" +
                std::to_string(variant.block_q) + "x" + std::to_string(variant.block_kv) + ")");
  if (variant.k.quantized() && variant.k.granularity != Granularity::per_tensor &&
      variant.k.granularity != Granularity::per_token) {
    const int group = variant.k.group_tokens > 0 ? variant.k.group_tokens : variant.block_kv;
    require(group % tunables.block_kv == 0 || tunables.block_kv % group == 0,
            "tunables.block_kv: must divide or be a multiple of K's group_tokens " + std::to_string(group));
  }
}

// Q.K^T: int8 codes (int4 codes are stored one per byte, so they are int8 codes to the mma: the legalized s4 -> s8
// program), or unquantized Q/K stored in the input's own type by the prologue; P.V by P's type.
void planOperands(KernelPlan &plan, const AttentionVariant &variant, InputType input) {
  const bool quantized_qk = variant.q.quantized();
  plan.qk_operand = quantized_qk ? ElementType::int8 : (input == InputType::f16 ? ElementType::f16 : ElementType::bf16);
  plan.qk_mma = quantized_qk ? MmaShape{16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32}
                             : MmaShape{16, 8, 16, plan.qk_operand, plan.qk_operand, AccumulatorType::f32};
  plan.q_scales = scaleIndexingOf(variant.q, variant.block_q);
  plan.k_scales = scaleIndexingOf(variant.k, variant.block_kv);
  if (plan.k_scales.used)
    plan.k_scales_per_block =
        static_cast<int>(plan.k_scales.groupOf(plan.tunables.block_kv - 1) - plan.k_scales.groupOf(0) + 1);

  if (variant.p.dtype == ElementType::int8) {
    plan.pv_path = PvPath::int8_per_block;
    plan.pv_mma = {16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32};
    plan.v_operand = ElementType::int8;
  } else if (variant.p.dtype == ElementType::e4m3) {
    plan.pv_path = PvPath::e4m3_accumulate_f32;
    plan.pv_mma = {16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32};
    plan.v_operand = ElementType::e4m3;
  } else if (variant.pv.accumulator == AccumulatorType::f16) {
    plan.pv_path = PvPath::f16_accumulate_f16;
    plan.pv_mma = {16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16};
    plan.v_operand = ElementType::f16;
  } else {
    plan.pv_path = PvPath::f16_accumulate_f32;
    plan.pv_mma = {16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32};
    plan.v_operand = ElementType::f16;
  }
  plan.interleave_kv_tokens = bytesOf(plan.pv_mma.a) == 1;
  if (plan.interleave_kv_tokens)
    plan.v_source = ValueSource::workspace_codes;
  else if (input == InputType::f16 && variant.smooth_v == SmoothScope::none)
    plan.v_source = ValueSource::input;
  else
    plan.v_source = ValueSource::workspace_values;
}

// FP4 by emulation: the legalized program's operands (fp4DecodedType: f16 for NVFP4, bf16 for MXFP4) in the 16-bit
// m16n8k16 mma for both matmuls. The microscales are applied by the decode, so S needs no dequantization; the kernel
// reads the prologue's codes and scales as the FP4 contract lays them out (K in natural token order).
void planFp4Operands(KernelPlan &plan, const AttentionVariant &variant) {
  const ElementType decoded = fp4DecodedType(variant.q.granularity);
  plan.qk_operand = ElementType::e2m1;
  plan.qk_mma = {16, 8, 16, decoded, decoded, AccumulatorType::f32};
  plan.pv_path = PvPath::e2m1_decoded;
  plan.pv_mma = plan.qk_mma;
  plan.v_operand = decoded;
  plan.v_source = ValueSource::workspace_codes;
  plan.fp4_scale_group = microscaleGroupSize(variant.q.granularity);
  plan.fp4_two_level_p = variant.p.two_level;
  plan.fp4_delta_s = variant.smooth_q == SmoothScope::block;
  plan.k_codes_token_order = KCodesTokenOrder::natural;
}

int alignUp(int value, int alignment) { return (value + alignment - 1) / alignment * alignment; }

SharedRegion region(int offset, int rows, int row_bytes) {
  return {offset, alignUp(rows * row_bytes, kRegionAlignment), rows, row_bytes};
}

// FP4 emulation: Q_i decoded once; per stage K_j's codes, V_j^T's codes and K_j's scales (cp.async); one pair of
// decoded K_j / V_j^T tiles, whose bytes first hold Q_i's codes and scales until Q_i is decoded.
SharedMemoryLayout layoutFp4SharedMemory(const KernelPlan &plan, int stages) {
  const Tunables &t = plan.tunables;
  const int d = plan.head_dim, group = plan.fp4_scale_group, value_bytes = bytesOf(plan.qk_mma.a);
  SharedMemoryLayout layout;
  layout.q = region(0, t.block_q, d * value_bytes);
  layout.decoded_k = region(layout.q.bytes, t.block_kv, d * value_bytes);
  layout.decoded_v = region(layout.decoded_k.offset + layout.decoded_k.bytes, d, t.block_kv * value_bytes);
  layout.q_codes = region(layout.decoded_k.offset, t.block_q, d / 2);
  layout.q_scales = region(layout.q_codes.offset + layout.q_codes.bytes, t.block_q, d / group);
  const int scratch_end =
      std::max(layout.decoded_v.offset + layout.decoded_v.bytes, layout.q_scales.offset + layout.q_scales.bytes);
  layout.k = region(0, t.block_kv, d / 2);
  layout.k_scales = region(layout.k.bytes, t.block_kv, d / group);
  layout.v = region(layout.k_scales.offset + layout.k_scales.bytes, d, t.block_kv / 2);
  layout.stage_offset = scratch_end;
  layout.stage_bytes = layout.v.offset + layout.v.bytes;
  layout.stages = stages;
  layout.total_bytes = layout.stage_offset + stages * layout.stage_bytes;
  return layout;
}

// Bytes of a Q/K/V tile row in shared memory: the row's 16-byte chunks padded to a power of two, so that the swizzle
// (sage/device/sm80/layout.cuh) permutes chunks within a row and the ldmatrix steps XOR constants into an address.
int sm80TileRowBytes(int row_bytes) {
  int padded = 16;
  while (padded < row_bytes)
    padded *= 2;
  return padded;
}

SharedMemoryLayout layoutSharedMemory(const KernelPlan &plan, int stages) {
  if (plan.pv_path == PvPath::e2m1_decoded)
    return layoutFp4SharedMemory(plan, stages);
  const Tunables &t = plan.tunables;
  const int qk_row_bytes = sm80TileRowBytes(plan.head_dim * bytesOf(plan.qk_operand));
  SharedMemoryLayout layout;
  layout.q = region(0, t.block_q, qk_row_bytes);
  layout.k = region(0, t.block_kv, qk_row_bytes);
  if (plan.v_source == ValueSource::workspace_codes) // V^T: rows are channels, b_kv one-byte codes each
    layout.v = region(layout.k.bytes, plan.head_dim, t.block_kv);
  else
    layout.v = region(layout.k.bytes, t.block_kv, sm80TileRowBytes(plan.head_dim * bytesOf(ElementType::f16)));
  const int staged_scales = plan.k_scales_per_block > 1 ? plan.k_scales_per_block : 0;
  layout.k_scales = region(layout.v.offset + layout.v.bytes, staged_scales > 0 ? 1 : 0, staged_scales * 4);
  layout.stage_offset = layout.q.bytes;
  layout.stage_bytes = layout.k.bytes + layout.v.bytes + layout.k_scales.bytes;
  layout.stages = stages;
  layout.total_bytes = layout.stage_offset + stages * layout.stage_bytes;
  return layout;
}

// A coarse count of the live 32-bit registers per thread, to decide whether two CTAs per SM can hold them.
int estimateRegisters(const KernelPlan &plan) {
  const int rows = plan.rows_per_warp, d = plan.head_dim, kv = plan.tunables.block_kv;
  int output = rows * d / kWarpSize; // one f32 per (row, channel) spread over the warp
  if (plan.pv_path == PvPath::f16_accumulate_f16)
    output /= 2;
  const int scores = rows * kv / kWarpSize;
  const int q_fragment = rows * d * bytesOf(plan.qk_mma.a) / (kWarpSize * 4);
  const int p_fragment = rows * kv * bytesOf(plan.pv_mma.a) / (kWarpSize * 4);
  // int8 P.V: one channel tile's V^T fragments (2 per k32 step) and the s32 block product beside O (sage-vb d80 with
  // two CTAs per SM spilled 36 bytes at 128 registers; with this term it gets one CTA and 198 registers, no spills)
  const int value_fragments = plan.pv_path == PvPath::int8_per_block ? 2 * (kv / kKvTokenQuantum) + 4 : 0;
  return kBaseRegisters + output + scores + q_fragment + p_fragment + value_fragments;
}

int outputAccumulatorRegisters(const KernelPlan &plan, const AttentionVariant &variant) {
  // Two-level accumulation keeps a second, f32 copy of O.
  const bool two_level = variant.accumulation.kind == AccumulationKind::f16_then_f32 ||
                         variant.accumulation.kind == AccumulationKind::f32_two_level;
  return two_level ? plan.rows_per_warp * plan.head_dim / kWarpSize : 0;
}

// The head dims the kernel tiles (sage/device/sm80/attention.cuh): whole m16n8 output tiles in pairs (d a multiple
// of 16); rows of Q/K/V tiles in shared memory padded to a power of two of 16-byte chunks, so the swizzle and the
// ldmatrix steps stay XORs of constants (int8 Q/K at d = 80: the Q.K^T mma's last k32 step reads a zero-filled chunk).
SupportResult headDimSupport(const AttentionVariant &variant) {
  const int d = variant.head_dim;
  const std::string which = "head_dim " + std::to_string(d);
  if (d < kMinHeadDim || d > kMaxHeadDim || d % kMmaRows != 0)
    return SupportResult::no(which + ": the sm80 schedule has tiles for head_dim " + std::to_string(kMinHeadDim) +
                             ".." + std::to_string(kMaxHeadDim) + " in steps of 16");
  if (SupportResult prologue = prologueHeadDimSupport(d); !prologue)
    return prologue;
  if (anyFp4(variant) && d != 64 && d != 128)
    return SupportResult::no(which + ": FP4 emulation on the sm80 schedule has decode tiles for head_dim 64 and 128 "
                                     "only");
  // Registers: a warp's 16 rows hold O_i in f32 (d / 2 registers per thread); two-level accumulation keeps a second
  // f32 copy, and with Q's fragments and S that passes the 255 registers of a thread beyond d = 128.
  const bool two_level = variant.accumulation.kind == AccumulationKind::f16_then_f32 ||
                         variant.accumulation.kind == AccumulationKind::f32_two_level;
  if (two_level && d > kMaxTwoLevelHeadDim)
    return SupportResult::no(which + ": two-level accumulation keeps two f32 copies of O (" + std::to_string(d) +
                             " registers per thread for a warp's 16 rows) on top of Q's fragments and S; the sm80 "
                             "schedule runs it up to head_dim " +
                             std::to_string(kMaxTwoLevelHeadDim));
  return SupportResult::yes();
}

} // namespace

std::string_view Sm80Schedule::summary() const {
  return "mma.sync m16n8k32 int8/e4m3 and m16n8k16 f16/bf16 (int4 Q/K decoded to int8: the s4 -> s8 legalization), "
         "ldmatrix, cp.async multi-stage K/V pipeline, one CTA per (Q block, head, batch), S and P in registers; Q "
         "smoothing's correction (prologue's delta_s) added to S; FP4 by emulation (e2m1 x microscale decoded exactly "
         "to "
         "f16/bf16, 16-bit mma.sync, f32 accumulation)";
}

SupportResult Sm80Schedule::supports(const AttentionVariant &variant, GpuArch arch, InputType) const {
  if (variant.version != kIrVersion)
    return SupportResult::no("variant IR version " + std::to_string(variant.version) + ", this schedule reads " +
                             std::to_string(kIrVersion));
  if (!hasInt8MmaSync(arch))
    return SupportResult::no(std::string(archName(arch)) + " has no mma.sync");
  if (SupportResult packed = packedSequencesSupport(variant); !packed)
    return packed;
  if (variant.sla.enabled) // the kernel would compute the critical blocks only: O^s without Proj(O^l)
    return SupportResult::no("SLA (mask prediction and the linear branch) is not an attention kernel of this "
                             "schedule; its sparse part alone (the variant without `sla`) is block_sparse");
  if (SupportResult head_dim = headDimSupport(variant); !head_dim)
    return head_dim;
  if (!validBlockKv(variant.block_kv))
    return SupportResult::no("block_kv " + std::to_string(variant.block_kv) + ": expected 32, 64 or 128");
  if (variant.block_q % kMmaRows != 0 || variant.block_q <= 0)
    return SupportResult::no("block_q " + std::to_string(variant.block_q) + ": expected a multiple of 16");
  // The kernel multiplies whatever codes the prologue wrote: a rotated variant runs where the prologue rotates it.
  if (SupportResult rotation = prologueRotationSupport(variant); !rotation)
    return rotation;
  if (anyFp4(variant))
    return checkFp4(variant, arch, extensions_);
  if (SupportResult qk = checkQk(variant, extensions_); !qk)
    return qk;
  return checkPv(variant, arch);
}

KernelPlan Sm80Schedule::plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                              std::optional<Tunables> tunables) const {
  requireSupported(variant, arch, input);
  const bool explicit_tunables = tunables.has_value();
  Tunables chosen = tunables.value_or(defaultTunables(variant, arch));
  if (!explicit_tunables) // small Q blocks: fewer warps rather than fewer than 16 rows per warp
    chosen.warps = std::max(1, std::min(chosen.warps, chosen.block_q / kMmaRows));
  validateTunables(chosen, variant);

  KernelPlan plan = planOf(variant, arch, input, chosen);
  plan.threads = chosen.warps * kWarpSize;
  plan.rows_per_warp = chosen.block_q / chosen.warps;
  plan.row_tiles_per_warp = plan.rows_per_warp / kMmaRows;

  if (variant.q.dtype == ElementType::e2m1)
    planFp4Operands(plan, variant);
  else
    planOperands(plan, variant, input);

  // Shared memory: default tunables give up pipeline depth before they give up fitting the arch.
  const GpuLimits limits = gpuLimits(arch);
  int stages = chosen.stages;
  plan.shared = detail::fitPipelineStages([&](int depth) { return layoutSharedMemory(plan, depth); }, stages,
                                          kMinStages, explicit_tunables, arch);
  plan.tunables.stages = stages;

  // Occupancy: two CTAs per SM when threads and the register estimate allow it. Default plans then also trim the
  // pipeline (not below kMinDefaultStages) until two CTAs' shared memory fits: on H100, sage-b d128 causal ran at
  // 387 TOPS with Table 12's 5 stages (one CTA per SM) against ~440 TOPS for two CTAs with 3-4 stages.
  const int by_threads = limits.max_threads_per_multiprocessor / plan.threads;
  const int registers = estimateRegisters(plan) + outputAccumulatorRegisters(plan, variant);
  // The estimate is calibrated at d 64 and 128; at d 80/96 on sm_90a two CTAs (128 registers) spilled 56-72 bytes
  // (sage-b, sage-t), so other head dims keep one CTA per SM.
  const bool calibrated = variant.head_dim == 64 || variant.head_dim == 128;
  const int by_registers =
      calibrated ? limits.registers_per_multiprocessor / (plan.threads * registers) : std::min(1, by_threads);
  const auto blocksByShared = [&](const SharedMemoryLayout &shared) {
    return limits.shared_bytes_per_multiprocessor / (shared.total_bytes + limits.reserved_shared_bytes_per_block);
  };
  if (!explicit_tunables && std::min(by_threads, by_registers) >= kTargetBlocksPerMultiprocessor)
    for (int trimmed = stages - 1;
         blocksByShared(plan.shared) < kTargetBlocksPerMultiprocessor && trimmed >= kMinDefaultStages; --trimmed) {
      const SharedMemoryLayout shorter = layoutSharedMemory(plan, trimmed);
      if (blocksByShared(shorter) >= kTargetBlocksPerMultiprocessor) {
        plan.shared = shorter;
        plan.tunables.stages = trimmed;
      }
    }
  plan.min_blocks_per_multiprocessor =
      std::max(1, std::min({kTargetBlocksPerMultiprocessor, blocksByShared(plan.shared), by_threads, by_registers}));

  plan.grid.block_q = chosen.block_q;
  plan.grid.reverse_q_blocks = variant.mask.kind == MaskKind::causal;
  return plan;
}

} // namespace sage::schedules
