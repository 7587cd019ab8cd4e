// The sm90 wgmma + TMA schedule: what it supports and how it tiles a variant (the kernel itself is
// codegen/device/sage/device/sm90/attention.cuh).
#include "sage/schedules/Sm90Schedule.h"
#include "PipelineStages.h"

#include "sage/schedules/GpuLimits.h"
#include "sage/schedules/PackedSequences.h"
#include "sage/schedules/PrologueHeadDim.h"
#include "sage/schedules/PrologueRotation.h"
#include "sage/schedules/Sm80Schedule.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::schedules {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpgroupWarps = 4;
constexpr int kConsumerRows = 64; // the M of every wgmma: one m64 tile per consumer warpgroup
constexpr int kMinStages = 2;
constexpr int kMaxStages = 8;
constexpr int kDefaultStages = 4;
constexpr int kSwizzleSpan = 128;      // bytes: the widest TMA box row that a 128-byte swizzle takes
constexpr int kNarrowSwizzleSpan = 64; // rows 128 does not divide (int8 Q/K at d = 192) use the 64-byte swizzle
constexpr int kWideOutput = 128;       // head dims above: P.V in column slices (sm90/tiles.cuh ValueSlices)
constexpr int kTileAlignment = 1024;   // swizzled tiles start on 1024-byte boundaries
constexpr int kAlignmentSlack = 1024;  // the dynamic buffer is rounded up to that boundary in the kernel
constexpr int kRegisterFile = 65536;   // 32-bit registers per SM
constexpr int kProducerRegisters = 24; // the producer only issues TMA from one thread
constexpr int kMaxConsumerRegisters = 240;
constexpr int kMaxConsumers = 3;
// Inline loads: CTAs of 128 threads per SM, the registers capped for them (3: 168 each; 4: 128)
constexpr int kDefaultInlineCtas = 3;
constexpr int kMaxInlineCtas = 4;
constexpr int kWideOuterSumCtas = 2;       // beyond d = 128 an outer sum needs 255 registers: at most 2 CTAs of 128
constexpr int kKeptBlockBytes = 16384 / 8; // block-sparse: the CTA's kept KV blocks as bits (kKeptBlockCapacity)

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

int alignUp(int value, int alignment) { return (value + alignment - 1) / alignment * alignment; }

// The width of a TMA box row (a tile's column chunk), as chunk_bytes_of_rows in sm90/tiles.cuh.
int chunkBytesOf(int row_bytes) {
  return row_bytes <= kSwizzleSpan ? row_bytes : (row_bytes % kSwizzleSpan == 0 ? kSwizzleSpan : kNarrowSwizzleSpan);
}

// The N of one P.V wgmma: O's columns it writes (emitted as Config::kPvSliceChannels). Beyond d = 128 an f32 or s32
// accumulator is issued over column slices of V: 8-bit V^T in halves (96 or 128 channels), f16 V in whole 64-channel
// swizzle atoms; an f16 accumulator (64 registers at d = 256) is written whole.
int pvSliceChannels(int head_dim, PvPath path) {
  if (head_dim <= kWideOutput || path == PvPath::f16_accumulate_f16)
    return head_dim;
  if (head_dim % kWideOutput == 0)
    return kWideOutput;
  const bool eight_bit = path == PvPath::int8_per_block || path == PvPath::e4m3_accumulate_f32;
  return eight_bit ? head_dim / 2 : 64;
}

// Whether the variant keeps an f32 sum of O beside the P.V accumulator (int8 P.V, two-level accumulation).
bool keepsOuterSum(const AttentionVariant &variant) {
  return variant.p.dtype == ElementType::int8 || variant.accumulation.kind == AccumulationKind::f16_then_f32 ||
         variant.accumulation.kind == AccumulationKind::f32_two_level;
}

// Mirrors SharedLayout<Config> in attention.cuh: Q_i, then `stages` x (K_j, V_j), then the mbarriers.
SharedMemoryLayout layoutSharedMemory(const KernelPlan &plan, int stages) {
  const WarpSpecialization &ws = plan.warp_specialization;
  const int qk_row_bytes = plan.head_dim * bytesOf(plan.qk_operand);
  const int v_rows = plan.v_source == ValueSource::workspace_codes ? plan.head_dim : plan.tunables.block_kv;
  const int v_row_bytes = plan.v_source == ValueSource::workspace_codes ? plan.tunables.block_kv : 2 * plan.head_dim;
  SharedMemoryLayout layout;
  layout.q = {0, qk_row_bytes * ws.q_box.rows, ws.q_box.rows, qk_row_bytes};
  layout.k = {0, qk_row_bytes * ws.k_box.rows, ws.k_box.rows, qk_row_bytes};
  layout.v = {alignUp(layout.k.bytes, kTileAlignment), v_rows * v_row_bytes, v_rows, v_row_bytes};
  layout.stage_offset = alignUp(layout.q.bytes, kTileAlignment);
  layout.stage_bytes = alignUp(layout.v.offset + layout.v.bytes, kTileAlignment);
  layout.stages = stages;
  const int kept_block_bytes = plan.block_sparse ? kKeptBlockBytes : 0;
  const int barrier_bytes = (4 * stages + 2) * 8; // full and empty, for K and for V, per stage; Q's full and empty
  layout.total_bytes =
      layout.stage_offset + stages * layout.stage_bytes + kept_block_bytes + barrier_bytes + kAlignmentSlack;
  return layout;
}

void validateTunables(const Tunables &tunables, const AttentionVariant &variant) {
  require(
      tunables.warps == 4 || tunables.warps == 8 || tunables.warps == 12,
      "tunables.warps: the sm90 schedule counts consumer warps, 4 per consumer warpgroup: expected 4, 8 or 12, got " +
          std::to_string(tunables.warps));
  require(tunables.block_q == kConsumerRows * tunables.warps / kWarpgroupWarps,
          "tunables.block_q: the sm90 schedule gives each consumer warpgroup 64 rows: expected 16 * warps (" +
              std::to_string(kConsumerRows * tunables.warps / kWarpgroupWarps) + "), got " +
              std::to_string(tunables.block_q));
  require(tunables.block_kv == 64 || tunables.block_kv == 128,
          "tunables.block_kv: expected 64 or 128 (the N of the Q.K^T wgmma), got " + std::to_string(tunables.block_kv));
  require(tunables.stages >= kMinStages && tunables.stages <= kMaxStages,
          "tunables.stages: expected " + std::to_string(kMinStages) + ".." + std::to_string(kMaxStages) + ", got " +
              std::to_string(tunables.stages));
  // Beyond d = 128 the outer sum (128 f32 registers at d = 256) and one column slice of the block's product fit a
  // thread only when S is not live beside them: the inline-loads kernel runs each block in order.
  if (variant.head_dim > kWideOutput && keepsOuterSum(variant)) {
    require(tunables.inline_loads,
            "tunables.inline_loads: at head_dim " + std::to_string(variant.head_dim) +
                " an outer f32 sum of O (int8 P.V or two-level accumulation) is folded one column slice at a time "
                "in the inline-loads kernel: expected 1");
    require(tunables.ctas == 1 || tunables.ctas == kWideOuterSumCtas,
            "tunables.ctas: at head_dim " + std::to_string(variant.head_dim) + " the outer f32 sum (" +
                std::to_string(variant.head_dim / 2) +
                " registers a thread) and a column slice's product need up to 255 registers, which 1 or 2 CTAs of "
                "128 threads per SM leave: expected 1 or 2, got " +
                std::to_string(tunables.ctas) + (tunables.ctas == 0 ? " (the default, 3)" : ""));
  }
  if (tunables.inline_loads) {
    require(tunables.warps == kWarpgroupWarps,
            "tunables.inline_loads: the consumer issues its own loads with one consumer warpgroup only: expected "
            "warps = 4, got " +
                std::to_string(tunables.warps));
    require(variant.mask.kind != MaskKind::block_sparse,
            "tunables.inline_loads: a block-sparse kernel walks its mask row in a producer warpgroup: expected 0");
  }
  require(tunables.ctas == 0 || (tunables.inline_loads && tunables.ctas <= kMaxInlineCtas),
          "tunables.ctas: the CTAs per SM of an inline-loads kernel (its 128 threads' register cap): expected 1.." +
              std::to_string(kMaxInlineCtas) + " with inline_loads=1, got " + std::to_string(tunables.ctas) +
              (tunables.inline_loads ? "" : " without inline loads"));
  // Both warp roles walk one mask row per CTA: a CTA's rows and a step's tokens must be one block of the mask.
  if (variant.mask.kind == MaskKind::block_sparse)
    require(tunables.block_q == variant.block_q && tunables.block_kv == variant.block_kv,
            "tunables.block_q/block_kv: a block_sparse variant's block mask is in units of its own blocks (" +
                std::to_string(variant.block_q) + "x" + std::to_string(variant.block_kv) +
                "), so the sm90 tiles must equal them, got " + std::to_string(tunables.block_q) + "x" +
                std::to_string(tunables.block_kv));
}

// Why the sm90 tiles cannot be a block-sparse variant's blocks ("" when they can): a CTA owns 64 rows per consumer
// warpgroup (1 to 3) and a step reads 64 or 128 tokens.
std::string blockSparseTilingProblem(const AttentionVariant &variant) {
  if (variant.block_q % kConsumerRows != 0 || variant.block_q / kConsumerRows > kMaxConsumers)
    return "block_q " + std::to_string(variant.block_q) +
           ": a block-sparse mask's Q blocks are the sm90 CTA's rows, 64 per consumer warpgroup: expected 64, 128 "
           "or 192";
  if (variant.block_kv != 64 && variant.block_kv != 128)
    return "block_kv " + std::to_string(variant.block_kv) +
           ": a block-sparse mask's KV blocks are the sm90 main loop's steps: expected 64 or 128";
  return "";
}

// How many CTAs of this shared-memory plan an SM holds.
int ctasPerMultiprocessor(const KernelPlan &plan, const SharedMemoryLayout &shared) {
  const GpuLimits limits = gpuLimits(plan.arch);
  return limits.shared_bytes_per_multiprocessor / (shared.total_bytes + limits.reserved_shared_bytes_per_block);
}

// Default tunables give up pipeline stages (down to kMinStages) until `ctas` CTAs fit an SM's shared memory; given
// tunables are kept as they are. Returns how many fit then.
int shortenStagesToFit(KernelPlan &plan, int ctas, bool explicit_tunables) {
  if (!explicit_tunables && ctasPerMultiprocessor(plan, plan.shared) < ctas)
    for (int stages = plan.tunables.stages - 1; stages >= kMinStages; --stages)
      if (const SharedMemoryLayout shorter = layoutSharedMemory(plan, stages);
          ctasPerMultiprocessor(plan, shorter) >= ctas) {
        plan.shared = shorter;
        plan.tunables.stages = stages;
        break;
      }
  return ctasPerMultiprocessor(plan, plan.shared);
}

// With one consumer warpgroup, two CTAs per SM overlap one's softmax with the other's GEMMs without taking turns
// (and, block-sparse, whose rows are short: SLA at 95% sparsity visits ~26 of 512 KV blocks, one CTA's start with the
// other's work). That needs both in shared memory and in the register file: the producer gives its registers to the
// consumer (24 + 232 = 2 x 128 per thread).
void shareMultiprocessor(KernelPlan &plan, bool explicit_tunables) {
  constexpr int kCtas = 2;
  if (shortenStagesToFit(plan, kCtas, explicit_tunables) < kCtas)
    return;
  WarpSpecialization &ws = plan.warp_specialization;
  const int threads_per_warpgroup = kWarpgroupWarps * kWarpSize;
  ws.producer_registers = kProducerRegisters;
  ws.consumer_registers =
      (kRegisterFile / kCtas - threads_per_warpgroup * kProducerRegisters) / threads_per_warpgroup / 8 * 8;
  plan.min_blocks_per_multiprocessor = kCtas;
}

// Without a producer warpgroup a CTA is one consumer warpgroup (128 threads) that issues its own loads, as
// SageAttention2's sm90 kernel is built: with S and the P.V's product never live together (the product is issued
// after the softmax), a thread needs ~170 registers, and three CTAs share an SM's register file, so three warpgroups'
// softmax and GEMMs interleave.
void shareMultiprocessorInline(KernelPlan &plan, bool explicit_tunables) {
  const int kCtas = plan.tunables.ctas != 0 ? plan.tunables.ctas : kDefaultInlineCtas;
  const int fitting = shortenStagesToFit(plan, kCtas, explicit_tunables);
  WarpSpecialization &ws = plan.warp_specialization;
  ws.producer_warpgroup = false;
  ws.producer_registers = 0;
  ws.consumer_registers = 0; // no hand-over: __launch_bounds__ caps the registers for min_blocks CTAs
  ws.softmax_under_product = false;
  plan.min_blocks_per_multiprocessor = std::clamp(fitting, 1, kCtas);
}

} // namespace

std::string_view Sm90Schedule::summary() const {
  return "wgmma (s8/e4m3/f16) + TMA with mbarriers; a producer warpgroup (or, e4m3 P.V, none: the consumer loads) "
         "and 64-row consumer warpgroups "
         "(setmaxnreg); P~ from registers";
}

int Sm90Schedule::preference(GpuArch arch) const { return arch == GpuArch::sm90a ? 200 : 0; }

Tunables Sm90Schedule::defaultTunables(const AttentionVariant &variant) {
  Tunables tunables;
  if (variant.mask.kind == MaskKind::block_sparse) { // the tiles are the mask's blocks
    tunables.warps = variant.block_q / kConsumerRows * kWarpgroupWarps;
    tunables.block_q = variant.block_q;
    tunables.block_kv = variant.block_kv;
    tunables.stages = kDefaultStages;
    return tunables;
  }
  // int8 P.V and two-level accumulation keep an f32 sum of O in registers beside the P.V accumulator: one consumer
  // warpgroup per CTA and two CTAs per SM (each consumer pipelines on its own, no turns), 128-token S tiles with the
  // product folded before the softmax. H200, sage2-fp8 d128, kernel alone at N = 1k / 4k / 16k (2026-11-28): 440 /
  // 623 / 712 TOPS, against 391 / 578 / 677 with two consumers taking turns at the same tiles and 329 / 476 / 564
  // with two consumers on 64-token tiles (softmax under the P.V); f16 P.V (no outer sum) is fastest with two
  // consumers taking turns (sage-b: 514 / 735 / 785, against 478 / 671 / 686).
  const bool outer_sum = keepsOuterSum(variant);
  tunables.warps = outer_sum ? kWarpgroupWarps : 2 * kWarpgroupWarps;
  tunables.block_q = kConsumerRows * tunables.warps / kWarpgroupWarps;
  tunables.block_kv = 128;
  tunables.stages = kDefaultStages; // fewer where shared memory is short (two CTAs per SM: 3 at d = 128)
  // e4m3 P.V: no producer warpgroup, three CTAs per SM (2 stages). H200, sage2-fp8 kernel alone at N = 1k / 4k / 16k
  // (2026-11-29, outputs bit-identical): d128 498 / 687 / 766 TOPS against 434 / 647 / 733 with the producer, causal
  // 4k / 16k 559 / 710 against 516 / 673; d64 408 / 484 / 523 against 337 / 426 / 466. sage-b (f16 P.V, two
  // consumers) lost that way: 469 / 614 / 619 against 546 / 751 / 771.
  tunables.inline_loads = variant.p.dtype == ElementType::e4m3;
  if (variant.head_dim > kWideOutput) {
    // Two consumers taking turns hold O, S_j and P~_(j-1) together in 240 registers: an f16 O (48 / 64 registers at
    // d = 192 / 256, with 64-token blocks at 256) or, at d = 192, an f32 O with 64-token blocks (ptxas: sage-b d = 256
    // spilled 4 bytes with 128-token blocks, none with 64; exact's f32 O at 256 192-208 bytes).
    const bool f16_output = variant.pv.accumulator == AccumulatorType::f16;
    const bool turns_fit = !outer_sum && (variant.head_dim != 256 || f16_output);
    tunables.block_kv = variant.head_dim == 256 || !f16_output ? 64 : 128;
    if (!turns_fit) {
      // One consumer with inline loads, each block in order (S never beside the P.V's product) and, with an outer
      // sum (96 / 128 f32 registers at d = 192 / 256), the product folded one column slice at a time; 64-token
      // blocks so that two CTAs' stages fit an SM's shared memory (a 128-token stage of d = 256 is 64 KB), each
      // CTA with up to 255 registers. Not measured yet.
      tunables.warps = kWarpgroupWarps;
      tunables.block_q = kConsumerRows;
      tunables.block_kv = 64;
      tunables.inline_loads = true;
      tunables.ctas = kWideOuterSumCtas;
    }
  }
  return tunables;
}

SupportResult Sm90Schedule::supports(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  if (!hasWgmma(arch))
    return SupportResult::no(std::string(archName(arch)) + " has no wgmma (the sm90 schedule needs sm_90a)");
  const int d = variant.head_dim;
  if (d != 64 && d != 128 && d != 192 && d != 256)
    return SupportResult::no("head_dim " + std::to_string(d) +
                             ": the sm90 schedule has tiles for head_dim 64, 128, 192 and 256 only");
  if (SupportResult packed = packedSequencesSupport(variant); !packed)
    return packed;
  if (variant.mask.kind == MaskKind::block_sparse) {
    if (const std::string problem = blockSparseTilingProblem(variant); !problem.empty())
      return SupportResult::no(problem);
    // A block-sparse CTA walks its mask row in a producer warpgroup, which the wide outer sum's inline kernel lacks;
    // and its tiles are the mask's blocks, not the wide head dims' tiles.
    if (d > kWideOutput)
      return SupportResult::no("head_dim " + std::to_string(d) +
                               ": the sm90 schedule's block-sparse kernels have tiles for head_dim 64 and 128 only");
  }
  // The same quantizers, accumulators and softmax as the mma.sync schedule: its verdict on what is computed holds.
  // Asked at d = 128 beyond it: the mma.sync schedule's own register limit there (two f32 copies of O for two-level
  // accumulation) is not this kernel's, which folds O's column slices; the head dim's prologue and rotation are
  // checked on their own.
  AttentionVariant numerics = variant;
  if (d > kWideOutput) {
    numerics.head_dim = kWideOutput;
    if (SupportResult prologue = prologueHeadDimSupport(d); !prologue)
      return prologue;
    if (SupportResult rotation = prologueRotationSupport(variant); !rotation)
      return rotation;
  }
  if (SupportResult verdict = Sm80Schedule().supports(numerics, arch, input); !verdict)
    return verdict;
  return SupportResult::yes();
}

KernelPlan Sm90Schedule::plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                              std::optional<Tunables> tunables) const {
  requireSupported(variant, arch, input);
  const bool explicit_tunables = tunables.has_value();
  const Tunables chosen = tunables.value_or(defaultTunables(variant));
  validateTunables(chosen, variant);

  KernelPlan plan = planOf(variant, arch, input, chosen);
  plan.block_sparse = variant.mask.kind == MaskKind::block_sparse;
  const int consumers = chosen.warps / kWarpgroupWarps;
  // the consumers and one producer warpgroup (none with inline loads)
  plan.threads = (chosen.warps + (chosen.inline_loads ? 0 : kWarpgroupWarps)) * kWarpSize;
  plan.rows_per_warp = 16;
  plan.row_tiles_per_warp = 1;

  // Q.K^T: int8 codes, or unquantized Q/K stored in the input's own type by the prologue.
  const bool quantized_qk = variant.q.quantized();
  plan.qk_operand = quantized_qk ? ElementType::int8 : (input == InputType::f16 ? ElementType::f16 : ElementType::bf16);
  plan.qk_mma = quantized_qk
                    ? MmaShape{64, chosen.block_kv, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32}
                    : MmaShape{64, chosen.block_kv, 16, plan.qk_operand, plan.qk_operand, AccumulatorType::f32};
  plan.q_scales = scaleIndexingOf(variant.q, variant.block_q);
  plan.k_scales = scaleIndexingOf(variant.k, variant.block_kv);
  if (plan.k_scales.used)
    plan.k_scales_per_block =
        static_cast<int>(plan.k_scales.groupOf(chosen.block_kv - 1) - plan.k_scales.groupOf(0) + 1);

  // P.V with P~ from registers
  if (variant.p.dtype == ElementType::int8) {
    plan.pv_path = PvPath::int8_per_block;
    plan.pv_mma = {64, variant.head_dim, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32};
  } else if (variant.p.dtype == ElementType::e4m3) {
    plan.pv_path = PvPath::e4m3_accumulate_f32;
    plan.pv_mma = {64, variant.head_dim, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32};
  } else if (variant.pv.accumulator == AccumulatorType::f16) {
    plan.pv_path = PvPath::f16_accumulate_f16;
    plan.pv_mma = {64, variant.head_dim, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16};
  } else {
    plan.pv_path = PvPath::f16_accumulate_f32;
    plan.pv_mma = {64, variant.head_dim, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32};
  }
  plan.pv_mma.n = pvSliceChannels(variant.head_dim, plan.pv_path);
  plan.v_operand = plan.pv_mma.b;
  if (variant.accumulation.kind == AccumulationKind::f16_then_f32 ||
      variant.accumulation.kind == AccumulationKind::f32_two_level) {
    // The variant flushes every flush_period of its KV blocks; the kernel's blocks may be larger (then it flushes
    // after each of them: more often than asked, which only rounds less) or smaller.
    const int64_t flush_tokens = static_cast<int64_t>(variant.accumulation.flush_period) * variant.block_kv;
    plan.two_level_flush_blocks = static_cast<int>(std::max<int64_t>(1, flush_tokens / chosen.block_kv));
    // Beyond d = 128 the kernel folds each block's product into the sum one column slice at a time: every block.
    if (variant.head_dim > kWideOutput)
      plan.two_level_flush_blocks = 1;
  }
  const bool eight_bit_pv = bytesOf(plan.pv_mma.a) == 1;
  plan.wgmma_value_token_order = eight_bit_pv;
  if (eight_bit_pv)
    plan.v_source = ValueSource::workspace_codes;
  else if (input == InputType::f16 && variant.smooth_v == SmoothScope::none)
    plan.v_source = ValueSource::input;
  else
    plan.v_source = ValueSource::workspace_values;

  // Warp roles and TMA boxes
  WarpSpecialization &ws = plan.warp_specialization;
  ws.consumer_warpgroups = consumers;
  // An outer f32 sum of O (int8 P.V, two-level accumulation) beside the P.V accumulator and a 128 x d >= 128 x 128
  // S tile do not fit 240 registers (ptxas spilled 168 bytes for sage2-fp8): fold the product before the softmax.
  const bool outer_sum = plan.pv_path == PvPath::int8_per_block || plan.two_level_flush_blocks > 0;
  ws.softmax_under_product = !(outer_sum && chosen.block_kv * variant.head_dim >= 128 * 128);
  if (consumers > 1) { // one consumer has registers to spare without the hand-over
    ws.producer_registers = kProducerRegisters;
    const int pool =
        (kRegisterFile - kWarpgroupWarps * kWarpSize * kProducerRegisters) / (consumers * kWarpgroupWarps * kWarpSize);
    ws.consumer_registers = std::min(kMaxConsumerRegisters, pool / 8 * 8);
  }
  const int qk_row_bytes = variant.head_dim * bytesOf(plan.qk_operand);
  ws.q_box = {chunkBytesOf(qk_row_bytes), chosen.block_q};
  ws.k_box = {chunkBytesOf(qk_row_bytes), chosen.block_kv};
  if (eight_bit_pv)
    ws.v_box = {chunkBytesOf(chosen.block_kv), variant.head_dim};
  else
    ws.v_box = {chunkBytesOf(2 * variant.head_dim), chosen.block_kv};

  // Shared memory: default tunables give up pipeline depth before they give up fitting the arch.
  int stages = chosen.stages;
  plan.shared = detail::fitPipelineStages([&](int depth) { return layoutSharedMemory(plan, depth); }, stages,
                                          kMinStages, explicit_tunables, arch);
  plan.tunables.stages = stages;
  plan.min_blocks_per_multiprocessor = 1;
  if (chosen.inline_loads)
    shareMultiprocessorInline(plan, explicit_tunables);
  else if (consumers == 1)
    shareMultiprocessor(plan, explicit_tunables);
  plan.grid.block_q = chosen.block_q;
  plan.grid.reverse_q_blocks = variant.mask.kind == MaskKind::causal;
  // Dense kernels are persistent: a CTA's producer loads the next tile's Q and first K/V stages while its consumers
  // finish the last one, so a tile's start and end no longer leave the SM idle (a short row is a few blocks only).
  // Block-sparse CTAs read their mask row into shared memory before the roles split: one tile each.
  // Inline loads: one tile per CTA, and the hardware's block scheduler starts the next as one ends.
  if (!plan.block_sparse && ws.producer_warpgroup)
    plan.grid.persistent_ctas_per_multiprocessor = plan.min_blocks_per_multiprocessor;
  return plan;
}

TunableSpace Sm90Schedule::tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  TunableSpace space;
  space.schedule = std::string(kName);
  space.defaults = plan(variant, arch, input).tunables;
  // A block-sparse variant's tiles are its mask's blocks: only the pipeline depth is free.
  const bool block_sparse = variant.mask.kind == MaskKind::block_sparse;
  for (int warps : {4, 8, 12})
    for (int block_kv : {64, 128})
      for (int stages = kMinStages; stages <= kMaxStages; ++stages)
        for (bool inline_loads : {false, true}) {
          Tunables candidate{kConsumerRows * warps / kWarpgroupWarps, block_kv, warps, stages, inline_loads};
          if (block_sparse && (candidate.block_q != variant.block_q || candidate.block_kv != variant.block_kv))
            continue;
          if (inline_loads && (warps != kWarpgroupWarps || block_sparse)) // not a choice there: not listed
            continue;
          // (and beyond d = 128 two CTAs, the default there)
          for (int ctas : {0, kWideOuterSumCtas, kMaxInlineCtas}) {
            if (ctas != 0 && !inline_loads)
              continue;
            if (ctas == kWideOuterSumCtas && variant.head_dim <= kWideOutput)
              continue;
            candidate.ctas = ctas;
            try {
              plan(variant, arch, input, candidate);
              space.candidates.push_back({candidate, SupportResult::yes()});
            } catch (const std::invalid_argument &error) {
              space.candidates.push_back({candidate, SupportResult::no(error.what())});
            }
          }
        }
  return space;
}

} // namespace sage::schedules
