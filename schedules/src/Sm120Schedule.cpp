// The sm120 FP4 schedule: what it supports and how it tiles a variant (the kernel itself is
// codegen/device/sage/device/sm120/attention.cuh, whose SharedLayout mirrors layoutSharedMemory below).
#include "sage/schedules/Sm120Schedule.h"
#include "PipelineStages.h"

#include "sage/schedules/GpuLimits.h"
#include "sage/schedules/PrologueRotation.h"

#include <stdexcept>
#include <string>

namespace sage::schedules {
namespace {

constexpr int kWarpSize = 32;
constexpr int kRowsPerWarp = 16; // one m16 tile of Q rows per warp
constexpr int kMmaK = 64;        // k of the block-scaled m16n8k64
constexpr int kMinStages = 2;
constexpr int kMaxStages = 4;
constexpr int kDefaultStages = 3;
constexpr int kRowPadding = 16; // bytes after each code row: the fragments' 32-bit loads hit 32 distinct banks
constexpr int kChunk = 16;      // cp.async granule

int alignUp(int value, int alignment) { return (value + alignment - 1) / alignment * alignment; }

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

// Q_i's codes (padded rows) and scales, then `stages` x (K_j codes, K_j scales, V_j^T codes, V_j^T scales, the
// block's delta_s row when Q is smoothed).
SharedMemoryLayout layoutSharedMemory(int head_dim, int block_q, int block_kv, int scale_group, bool delta_s,
                                      int stages) {
  const int code_row = head_dim / 2 + kRowPadding;
  const int scale_row = head_dim / scale_group;
  const int v_row = block_kv / 2 + kRowPadding;
  const int v_scale_row = block_kv / scale_group;
  SharedMemoryLayout layout;
  layout.q = {0, block_q * code_row, block_q, code_row};
  const int q_scales_offset = layout.q.bytes;
  layout.stage_offset = alignUp(q_scales_offset + block_q * scale_row, kChunk);
  layout.k = {0, block_kv * code_row, block_kv, code_row};
  layout.k_scales = {layout.k.bytes, block_kv * scale_row, block_kv, scale_row};
  layout.v = {alignUp(layout.k_scales.offset + layout.k_scales.bytes, kChunk), head_dim * v_row, head_dim, v_row};
  const int v_scales_offset = layout.v.offset + layout.v.bytes;
  const int delta_s_offset = alignUp(v_scales_offset + head_dim * v_scale_row, kChunk);
  layout.stage_bytes = alignUp(delta_s_offset + (delta_s ? block_kv * static_cast<int>(sizeof(float)) : 0), kChunk);
  layout.stages = stages;
  layout.total_bytes = layout.stage_offset + stages * layout.stage_bytes;
  return layout;
}

bool fp4Operand(const QuantizerSpec &spec, Granularity granularity, ScaleType scale) {
  return spec.dtype == ElementType::e2m1 && spec.granularity == granularity && spec.scale_type == scale &&
         spec.static_scale <= 0.0;
}

void validateTunables(const Tunables &tunables, const AttentionVariant &variant) {
  require(!tunables.inline_loads, "tunables.inline_loads: the sm120 schedule has no producer warps (every warp loads "
                                  "its tiles with cp.async): expected 0");
  require(tunables.ctas == 0, "tunables.ctas: only the sm90 schedule's inline loads take a CTA count, expected none, "
                              "got " +
                                  std::to_string(tunables.ctas));
  require(tunables.warps == 4 || tunables.warps == 8,
          "tunables.warps: expected 4 or 8 (16 Q rows each), got " + std::to_string(tunables.warps));
  require(tunables.block_q == kRowsPerWarp * tunables.warps,
          "tunables.block_q: the sm120 schedule gives each warp 16 rows: expected 16 * warps (" +
              std::to_string(kRowsPerWarp * tunables.warps) + "), got " + std::to_string(tunables.block_q));
  require(variant.block_q % tunables.block_q == 0,
          "tunables.block_q: must divide the variant's block_q " + std::to_string(variant.block_q) +
              " (the workspace pads Q to it), got " + std::to_string(tunables.block_q));
  // P's two-level scale and microscales are taken per row of one S tile: another tile width quantizes P differently
  // from the reference.
  require(tunables.block_kv == variant.block_kv,
          "tunables.block_kv: FP4 P is quantized per S tile, so it must be the variant's block_kv " +
              std::to_string(variant.block_kv) + ", got " + std::to_string(tunables.block_kv));
  require(tunables.stages >= kMinStages && tunables.stages <= kMaxStages,
          "tunables.stages: expected " + std::to_string(kMinStages) + ".." + std::to_string(kMaxStages) + ", got " +
              std::to_string(tunables.stages));
}

} // namespace

int fp4ScoreColumnToken(int column) {
  const int within = column % 32;
  return column - within + 8 * ((within % 8) / 2) + 2 * (within / 8) + within % 2;
}

std::string_view Sm120Schedule::summary() const {
  return "block-scaled FP4 mma.sync m16n8k64 (e2m1, ue4m3/ue8m0) for Q.K^T and P.V, P quantized in registers "
         "(cvt e2m1x2), K rows permuted in shared memory; cp.async pipeline";
}

int Sm120Schedule::preference(GpuArch arch) const { return arch == GpuArch::sm120f ? 300 : 0; }

Tunables Sm120Schedule::defaultTunables(const AttentionVariant &variant) {
  Tunables tunables;
  tunables.warps = variant.block_q % (4 * kRowsPerWarp) == 0 ? 4 : 8;
  tunables.block_q = kRowsPerWarp * tunables.warps;
  tunables.block_kv = variant.block_kv;
  tunables.stages = kDefaultStages;
  return tunables;
}

SupportResult Sm120Schedule::supports(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  (void)input; // f16 and bf16 inputs are both quantized by the prologue: the kernel reads only codes
  if (arch == GpuArch::sm100f)
    return SupportResult::no("sm_100f: ptxas 13.0 rejects the block-scaled mma.sync there (sm_100a, sm_100f and "
                             "sm_103a; that family's block-scaled FP4 is tcgen05.mma, not this schedule)");
  if (arch != GpuArch::sm120f)
    return SupportResult::no(std::string(archName(arch)) +
                             " has no block-scaled FP4 mma.sync (mma ... kind::mxf4nvf4.block_scale: sm_120f only)");
  const bool nvfp4 = fp4Operand(variant.q, Granularity::microscale_1x16, ScaleType::ue4m3);
  const bool mxfp4 = fp4Operand(variant.q, Granularity::microscale_1x32, ScaleType::ue8m0);
  if (!nvfp4 && !mxfp4)
    return SupportResult::no("the sm120 schedule runs FP4 Q.K^T only: Q must be e2m1 with microscale_1x16 ue4m3 "
                             "(NVFP4) or microscale_1x32 ue8m0 (MXFP4) scales, got " +
                             std::string(nameOf(variant.q.dtype)) + " " + std::string(nameOf(variant.q.granularity)));
  if (variant.packed_sequences)
    return SupportResult::no("packed sequences: not built for the FP4 kernel yet");
  if (SupportResult rotation = prologueRotationSupport(variant); !rotation)
    return rotation; // FP4 Q/K: the prologue does not rotate them
  const Granularity granularity = variant.q.granularity;
  const ScaleType scale = variant.q.scale_type;
  const std::string format = nvfp4 ? "NVFP4 (e2m1, microscale_1x16, ue4m3)" : "MXFP4 (e2m1, microscale_1x32, ue8m0)";
  if (!fp4Operand(variant.k, granularity, scale))
    return SupportResult::no("K must be quantized as Q: " + format);
  if (!fp4Operand(variant.p, granularity, scale))
    return SupportResult::no("P must be quantized as Q and K: " + format);
  if (!fp4Operand(variant.v, granularity, scale))
    return SupportResult::no("V must be quantized as Q and K: " + format + ", along the tokens");
  if (variant.qk.a != ElementType::e2m1 || variant.qk.b != ElementType::e2m1 ||
      variant.qk.accumulator != AccumulatorType::f32 || variant.pv.a != ElementType::e2m1 ||
      variant.pv.b != ElementType::e2m1 || variant.pv.accumulator != AccumulatorType::f32)
    return SupportResult::no("both matmuls must be e2m1 x e2m1 with an f32 accumulator");
  if (variant.accumulation.kind != AccumulationKind::f32)
    return SupportResult::no("accumulation must be f32 (the block-scaled mma accumulates in f32; got " +
                             std::string(nameOf(variant.accumulation.kind)) + ")");
  if (variant.head_dim != 64 && variant.head_dim != 128)
    return SupportResult::no("head_dim " + std::to_string(variant.head_dim) +
                             ": the sm120 schedule has tiles for head_dim 64 and 128 only");
  if (variant.block_kv != 64 && variant.block_kv != 128)
    return SupportResult::no("block_kv " + std::to_string(variant.block_kv) +
                             ": the sm120 schedule's S tile is 64 or 128 tokens (whole k64 P.V mmas)");
  if (variant.block_q % kRowsPerWarp != 0 || variant.block_q % (4 * kRowsPerWarp) != 0)
    return SupportResult::no("block_q " + std::to_string(variant.block_q) +
                             ": must be a multiple of 64 (4 or 8 warps of 16 rows)");
  if (variant.mask.kind == MaskKind::block_sparse)
    return SupportResult::no("block-sparse masks are not in the sm120 schedule");
  if (!variant.exp2_softmax)
    return SupportResult::no("the sm120 schedule's softmax is base 2 (exp2_softmax)");
  if (variant.smooth_v != SmoothScope::none)
    return SupportResult::no("smoothed V is not in the sm120 schedule (no FP4 preset smooths V)");
  if (variant.smooth_q != SmoothScope::none && variant.smooth_q != SmoothScope::block)
    return SupportResult::no("Q smoothing must be per Q block (the delta_s correction is per Q block)");
  if (variant.smooth_k != SmoothScope::none && variant.smooth_k != SmoothScope::sequence)
    return SupportResult::no("K smoothing must be over the sequence");
  return SupportResult::yes();
}

KernelPlan Sm120Schedule::plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                               std::optional<Tunables> tunables) const {
  requireSupported(variant, arch, input);
  const bool explicit_tunables = tunables.has_value();
  const Tunables chosen = tunables.value_or(defaultTunables(variant));
  validateTunables(chosen, variant);

  KernelPlan plan = planOf(variant, arch, input, chosen);
  plan.threads = chosen.warps * kWarpSize;
  plan.rows_per_warp = kRowsPerWarp;
  plan.row_tiles_per_warp = 1;
  plan.qk_operand = ElementType::e2m1;
  plan.qk_mma = {16, 8, kMmaK, ElementType::e2m1, ElementType::e2m1, AccumulatorType::f32};
  plan.pv_mma = plan.qk_mma;
  plan.pv_path = PvPath::e2m1_block_scaled;
  plan.v_source = ValueSource::workspace_codes;
  plan.v_operand = ElementType::e2m1;
  plan.fp4_scale_group = microscaleGroupSize(variant.q.granularity);
  plan.fp4_two_level_p = variant.p.two_level;
  plan.fp4_delta_s = variant.smooth_q == SmoothScope::block;
  plan.k_codes_token_order = KCodesTokenOrder::natural;
  plan.fp4_permute_k_rows_in_shared = true;

  int stages = chosen.stages;
  plan.shared = detail::fitPipelineStages(
      [&](int depth) {
        return layoutSharedMemory(variant.head_dim, chosen.block_q, chosen.block_kv, plan.fp4_scale_group,
                                  plan.fp4_delta_s, depth);
      },
      stages, kMinStages, explicit_tunables, arch);
  plan.tunables.stages = stages;
  plan.min_blocks_per_multiprocessor = 1;
  plan.grid.block_q = chosen.block_q;
  plan.grid.reverse_q_blocks = variant.mask.kind == MaskKind::causal;
  return plan;
}

TunableSpace Sm120Schedule::tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  TunableSpace space;
  space.schedule = std::string(kName);
  space.defaults = plan(variant, arch, input).tunables;
  for (int warps : {4, 8})
    for (int stages = kMinStages; stages <= kMaxStages; ++stages) {
      Tunables candidate{kRowsPerWarp * warps, variant.block_kv, warps, stages};
      try {
        plan(variant, arch, input, candidate);
        space.candidates.push_back({candidate, SupportResult::yes()});
      } catch (const std::invalid_argument &error) {
        space.candidates.push_back({candidate, SupportResult::no(error.what())});
      }
    }
  return space;
}

} // namespace sage::schedules
