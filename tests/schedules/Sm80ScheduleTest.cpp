// The sm80 mma.sync schedule: what it supports (with reasons) and the plans it makes.
#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/GpuLimits.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/WorkspaceLayout.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using namespace sage;
using namespace sage::schedules;

namespace {

const GpuArch kArchs[] = {GpuArch::sm80,  GpuArch::sm86,   GpuArch::sm89,
                          GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f};

std::string reasonFor(const AttentionVariant &variant, GpuArch arch = GpuArch::sm90a) {
  SupportResult result = Sm80Schedule().supports(variant, arch, InputType::f16);
  CHECK_FALSE(result.supported);
  return result.reason;
}

} // namespace

TEST_CASE("every preset is supported at head_dim 64 and 128; FP8 P.V only from sm_89") {
  for (const std::string &name : test::presetNames())
    for (int head_dim : {64, 128})
      for (GpuArch arch : kArchs)
        for (InputType input : {InputType::f16, InputType::bf16}) {
          CAPTURE(name);
          CAPTURE(head_dim);
          CAPTURE(archName(arch));
          const SupportResult result = Sm80Schedule().supports(test::presetVariant(name, head_dim), arch, input);
          const bool needs_fp8 = name == "sage2-fp8";
          CHECK(result.supported == (!needs_fp8 || hasFp8MmaSync(arch)));
          if (!result.supported)
            CHECK(result.reason.find("sm_89") != std::string::npos);
          else
            CHECK(result.reason.empty());
        }
}

TEST_CASE("head dims 32..256 in steps of 16: every forward preset, two-level accumulation up to 128") {
  const char *presets[] = {"sage-b", "sage-t", "sage-vb", "sage-vt", "sage2-fp8", "exact"};
  for (int head_dim : {32, 80, 96, 160, 192, 256})
    for (const char *name : presets)
      for (InputType input : {InputType::f16, InputType::bf16}) {
        CAPTURE(head_dim);
        CAPTURE(name);
        const AttentionVariant variant = test::presetVariant(name, head_dim);
        const SupportResult result = Sm80Schedule().supports(variant, GpuArch::sm89, input);
        const bool two_level = std::string(name) == "sage2-fp8";
        CHECK(result.supported == (!two_level || head_dim <= 128));
        if (result.supported) { // the plan fits the arch's shared memory, Q/K/V rows padded to powers of two
          const KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm89, input);
          CHECK(plan.shared.total_bytes <= gpuLimits(GpuArch::sm89).max_dynamic_shared_bytes_per_block);
          const int q_row_bytes = plan.shared.q.row_bytes;
          CHECK((q_row_bytes & (q_row_bytes - 1)) == 0);
          CHECK(q_row_bytes >= head_dim * bytesOf(plan.qk_operand));
          CHECK(q_row_bytes < 2 * head_dim * bytesOf(plan.qk_operand));
          CHECK(plan.rows_per_warp * head_dim / 32 <= 128); // O_i in f32: at most 128 registers a thread
        } else {
          CHECK(result.reason.find("head_dim " + std::to_string(head_dim)) != std::string::npos);
          CHECK(result.reason.find("two-level accumulation") != std::string::npos);
        }
      }
  // FP4 emulation keeps its decode tiles for 64 and 128
  const AttentionVariant fp4 = test::presetVariant("sage3-fp4", 96);
  CHECK(reasonFor(fp4).find("head_dim 96: FP4 emulation") != std::string::npos);
}

TEST_CASE("unsupported variants say why") {
  CHECK(reasonFor(test::presetVariant("sage-b", 16)).find("head_dim 16") != std::string::npos);
  AttentionVariant wide_kv = test::presetVariant("sage-b");
  wide_kv.block_kv = wide_kv.k.group_tokens = 96;
  CHECK(reasonFor(wide_kv).find("block_kv 96") != std::string::npos);

  AttentionVariant int4 = test::presetVariant("sage-b");
  int4.q.dtype = int4.k.dtype = ElementType::int4;
  CHECK(reasonFor(int4).find("int4") != std::string::npos);

  AttentionVariant fp4 = test::presetVariant("sage-b");
  fp4.p = test::quantizer(ElementType::e2m1, Granularity::microscale_1x16);
  fp4.p.scale_type = ScaleType::ue4m3;
  fp4.v = fp4.p;
  CHECK(reasonFor(fp4).find("FP4") != std::string::npos);

  AttentionVariant smooth_q = test::presetVariant("sage-b");
  smooth_q.smooth_q = SmoothScope::block;
  CHECK(reasonFor(smooth_q).find("Q smoothing") != std::string::npos);

  AttentionVariant bf16_pv = test::presetVariant("sage-b");
  bf16_pv.p = bf16_pv.v = test::cast(ElementType::bf16);
  CHECK(reasonFor(bf16_pv).find("bf16 P.V") != std::string::npos);

  AttentionVariant dynamic_p = test::presetVariant("sage-vb");
  dynamic_p.p.static_scale = 0.0;
  CHECK(reasonFor(dynamic_p).find("static scale") != std::string::npos);

  AttentionVariant no_flush = test::presetVariant("sage2-fp8");
  no_flush.accumulation.flush_period = 0;
  CHECK(reasonFor(no_flush).find("flush_period") != std::string::npos);

  AttentionVariant mixed = test::presetVariant("sage-b");
  mixed.k = test::cast(ElementType::f16);
  CHECK(reasonFor(mixed).find("both be quantized") != std::string::npos);

  AttentionVariant odd_k_group = test::presetVariant("sage-b");
  odd_k_group.k.group_tokens = 48;
  CHECK(reasonFor(odd_k_group).find("block_kv") != std::string::npos);
}

TEST_CASE("plan throws the support reason for an unsupported variant") {
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(test::presetVariant("sage2-fp8"), GpuArch::sm80, InputType::f16),
                       doctest::Contains("sm_89"), std::invalid_argument);
}

TEST_CASE("sage-b d128: 128 x 64 tiles on 4 warps, int8 Q.K^T, f16 P.V with an f16 accumulator") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  const KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16);
  CHECK(plan.schedule == Sm80Schedule::kName);
  CHECK(plan.tunables == Tunables{128, 64, 4, 2});
  CHECK(plan.threads == 128);
  CHECK(plan.rows_per_warp == 32);
  CHECK(plan.row_tiles_per_warp == 2);
  CHECK(plan.qk_operand == ElementType::int8);
  CHECK(plan.qk_mma == MmaShape{16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32});
  CHECK(plan.pv_mma == MmaShape{16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f16});
  CHECK(plan.pv_path == PvPath::f16_accumulate_f16);
  CHECK(plan.v_source == ValueSource::input);
  CHECK_FALSE(plan.interleave_kv_tokens);
  CHECK(plan.k_scales_per_block == 1);
  // Q 128 x 128 int8, then 2 stages of K 64 x 128 int8 + V 64 x 128 f16
  CHECK(plan.shared.q.bytes == 128 * 128);
  CHECK(plan.shared.k.bytes == 64 * 128);
  CHECK(plan.shared.v.bytes == 64 * 128 * 2);
  CHECK(plan.shared.total_bytes == 128 * 128 + 2 * (64 * 128 + 64 * 256));
}

TEST_CASE("V's source follows the input type and V smoothing") {
  AttentionVariant variant = test::presetVariant("sage-t", 64);
  CHECK(Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16).v_source == ValueSource::input);
  CHECK(Sm80Schedule().plan(variant, GpuArch::sm80, InputType::bf16).v_source == ValueSource::workspace_values);
  variant.smooth_v = SmoothScope::sequence;
  CHECK(Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16).v_source == ValueSource::workspace_values);
}

TEST_CASE("8-bit P.V reads transposed V codes and interleaves S's columns") {
  const KernelPlan vb = Sm80Schedule().plan(test::presetVariant("sage-vb", 128), GpuArch::sm80, InputType::f16);
  CHECK(vb.pv_path == PvPath::int8_per_block);
  CHECK(vb.pv_mma == MmaShape{16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32});
  CHECK(vb.v_source == ValueSource::workspace_codes);
  CHECK(vb.interleave_kv_tokens);
  CHECK(vb.shared.v.rows == 128);     // one row per channel
  CHECK(vb.shared.v.row_bytes == 64); // b_kv one-byte codes

  const KernelPlan fp8 = Sm80Schedule().plan(test::presetVariant("sage2-fp8", 64), GpuArch::sm89, InputType::bf16);
  CHECK(fp8.pv_path == PvPath::e4m3_accumulate_f32);
  CHECK(fp8.pv_mma == MmaShape{16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32});
  CHECK(fp8.interleave_kv_tokens);
}

TEST_CASE("exact runs Q.K^T in the input's type and P.V in f16 with f32 accumulation") {
  const KernelPlan plan = Sm80Schedule().plan(test::presetVariant("exact", 64), GpuArch::sm80, InputType::bf16);
  CHECK(plan.qk_operand == ElementType::bf16);
  CHECK(plan.qk_mma == MmaShape{16, 8, 16, ElementType::bf16, ElementType::bf16, AccumulatorType::f32});
  CHECK(plan.pv_path == PvPath::f16_accumulate_f32);
  CHECK_FALSE(plan.q_scales.used);
  CHECK(plan.k_scales_per_block == 0);
  CHECK(plan.shared.q.row_bytes == 64 * 2);
}

TEST_CASE("default plans fit every arch's shared memory, giving up pipeline stages first") {
  for (const std::string &name : test::presetNames())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (GpuArch arch : kArchs) {
          const AttentionVariant variant = test::presetVariant(name, head_dim, mask);
          if (!Sm80Schedule().supports(variant, arch, InputType::f16))
            continue;
          CAPTURE(name);
          CAPTURE(head_dim);
          CAPTURE(archName(arch));
          const KernelPlan plan = Sm80Schedule().plan(variant, arch, InputType::f16);
          const SharedMemoryLayout &shared = plan.shared;
          CHECK(shared.total_bytes <= gpuLimits(arch).max_dynamic_shared_bytes_per_block);
          CHECK(plan.tunables.stages >= 2);
          CHECK(plan.tunables.stages <= defaultTunables(variant).stages);
          CHECK(shared.total_bytes == shared.stage_offset + shared.stages * shared.stage_bytes);
          CHECK(shared.q.offset + shared.q.bytes <= shared.stage_offset);
          CHECK(shared.k.offset + shared.k.bytes <= shared.v.offset);
          CHECK(shared.v.offset + shared.v.bytes <= shared.stage_bytes);
          CHECK(shared.stage_bytes % 128 == 0);
          CHECK(plan.min_blocks_per_multiprocessor >= 1);
        }
  // exact d128 (f16 Q/K tiles) needs fewer stages on the 99 KiB archs than on sm_90a
  const AttentionVariant exact = test::presetVariant("exact", 128, MaskKind::causal);
  CHECK(Sm80Schedule().plan(exact, GpuArch::sm86, InputType::f16).tunables.stages <
        Sm80Schedule().plan(exact, GpuArch::sm90a, InputType::f16).tunables.stages);
}

TEST_CASE("explicit tunables are validated, naming the tunable") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{96, 64, 4, 3}),
                       doctest::Contains("tunables.block_q"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{128, 48, 8, 3}),
                       doctest::Contains("tunables.block_kv"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 2, 3}),
                       doctest::Contains("tunables.warps"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{128, 64, 8, 9}),
                       doctest::Contains("tunables.stages"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm86, InputType::f16, Tunables{128, 64, 8, 5}),
                       doctest::Contains("shared memory"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{128, 64, 8, 3, false, 4}),
                       doctest::Contains("tunables.ctas"), std::invalid_argument);
  const KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 4, 4});
  CHECK(plan.rows_per_warp == 16);
  CHECK(plan.tunables.stages == 4);
  CHECK(plan.grid.block_q == 64);

  AttentionVariant sparse = test::presetVariant("sage-b", 128, MaskKind::block_sparse);
  CHECK_THROWS_WITH_AS(Sm80Schedule().plan(sparse, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 4, 3}),
                       doctest::Contains("block_sparse"), std::invalid_argument);
}

TEST_CASE("scale groups match the workspace's scaleGroupOfToken") {
  AttentionVariant per_thread = test::presetVariant("sage-b", 128);
  per_thread.q.granularity = per_thread.k.granularity = Granularity::per_thread;
  per_thread.q.group_tokens = 32;
  per_thread.k.group_tokens = 64;
  for (const AttentionVariant &variant :
       {test::presetVariant("sage-t"), test::presetVariant("sage-b"), test::presetVariant("sage2-fp8"), per_thread}) {
    CAPTURE(variant.name);
    const KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm89, InputType::f16);
    for (int64_t token = 0; token < 1000; ++token) {
      CHECK(plan.q_scales.groupOf(token) == scaleGroupOfToken(variant.q, variant.block_q, token));
      CHECK(plan.k_scales.groupOf(token) == scaleGroupOfToken(variant.k, variant.block_kv, token));
    }
  }
  CHECK(Sm80Schedule().plan(test::presetVariant("sage-t"), GpuArch::sm80, InputType::f16).k_scales_per_block == 64);
  CHECK(Sm80Schedule().plan(per_thread, GpuArch::sm80, InputType::f16).k_scales_per_block == 8);
}

TEST_CASE("one CTA per (Q block, head, batch); causal schedules the longest rows first") {
  const KernelPlan plain = Sm80Schedule().plan(test::presetVariant("sage-b", 64), GpuArch::sm80, InputType::f16);
  const ProblemShape shape{2, 4, 2, 300, 700, 64};
  CHECK(plain.grid.gridFor(shape) == std::array<int64_t, 3>{3, 4, 2});
  CHECK_FALSE(plain.grid.reverse_q_blocks);
  const KernelPlan causal =
      Sm80Schedule().plan(test::presetVariant("sage-b", 64, MaskKind::causal), GpuArch::sm80, InputType::f16);
  CHECK(causal.grid.reverse_q_blocks);
  CHECK(causal.grid.description().find("longest rows first") != std::string::npos);
}

TEST_CASE("the registry picks the sm80 schedule where it is the one that runs, or lists every schedule's reason") {
  const std::vector<ScheduleVerdict> verdicts =
      scheduleVerdicts(test::presetVariant("sage-b"), GpuArch::sm89, InputType::f16);
  REQUIRE(verdicts.size() == allSchedules().size());
  CHECK(verdicts[0].schedule == Sm80Schedule::kName);
  CHECK(verdicts[0].support.supported);
  CHECK(planBestSchedule(test::presetVariant("sage-b"), GpuArch::sm89, InputType::f16).schedule == Sm80Schedule::kName);
  CHECK_THROWS_WITH_AS(planBestSchedule(test::presetVariant("sage-b", 16), GpuArch::sm90a, InputType::f16),
                       doctest::Contains("sm80.mma_sync: head_dim 16"), std::invalid_argument);
}

TEST_CASE("default plans trade pipeline depth for a second CTA per SM") {
  // Table 12 asks 4 stages for d64 causal; on sm_86's 100 KiB of shared memory 3 stages let two CTAs share an SM.
  const KernelPlan causal =
      Sm80Schedule().plan(test::presetVariant("sage-b", 64, MaskKind::causal), GpuArch::sm86, InputType::f16);
  CHECK(causal.tunables.stages == 3);
  CHECK(causal.min_blocks_per_multiprocessor == 2);
  // An explicit pipeline depth is kept as given.
  const KernelPlan explicit_depth = Sm80Schedule().plan(test::presetVariant("sage-b", 128, MaskKind::causal),
                                                        GpuArch::sm90a, InputType::f16, Tunables{128, 64, 8, 5});
  CHECK(explicit_depth.tunables.stages == 5);
  CHECK(explicit_depth.min_blocks_per_multiprocessor == 1);
  // f32 accumulators do not leave registers for two CTAs of 8 warps: the table's depth stays.
  const KernelPlan fp8 =
      Sm80Schedule().plan(test::presetVariant("sage2-fp8", 128, MaskKind::causal), GpuArch::sm90a, InputType::f16);
  CHECK(fp8.tunables.warps == 8);
  CHECK(fp8.tunables.stages == 5);
  CHECK(fp8.min_blocks_per_multiprocessor == 1);
}

TEST_CASE("issue 11: the registered sm80 schedule runs INT4 (as int8 codes) with Q smoothing") {
  const Sm80Schedule full = Sm80Schedule::full();
  for (const char *name : {"sage2-int4", "sage2-int4-no-smooth-q"})
    for (int head_dim : {64, 128})
      for (GpuArch arch : kArchs) {
        CAPTURE(name);
        CAPTURE(archName(arch));
        const AttentionVariant variant = test::presetVariant(name, head_dim);
        const SupportResult result = full.supports(variant, arch, InputType::f16);
        CHECK(result.supported == hasFp8MmaSync(arch)); // their P.V is e4m3
        if (!result.supported)
          continue;
        const KernelPlan plan = full.plan(variant, arch, InputType::f16);
        // The legalized s4 -> s8 program: int8 codes, m16n8k32 s8; per-thread scale groups interleaved by 8.
        CHECK(plan.qk_operand == ElementType::int8);
        CHECK(plan.qk_mma == MmaShape{16, 8, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32});
        CHECK(plan.q_scales.interleave == 8);
        CHECK(plan.k_scales.interleave == 8);
        // The registry's instance is the full one: the sm80 schedule is the one that runs them, also on sm_90a.
        CHECK(planBestSchedule(variant, arch, InputType::f16).schedule == Sm80Schedule::kName);
      }
  // A default Sm80Schedule judges only the numerics it shares with the sm90 kernels, so the sm90 schedule (which
  // asks it) refuses these.
  const AttentionVariant int4 = test::presetVariant("sage2-int4");
  CHECK(reasonFor(int4).find("Q smoothing") != std::string::npos);
  CHECK(reasonFor(test::presetVariant("sage2-int4-no-smooth-q")).find("int4") != std::string::npos);
  const SupportResult sm90 = findSchedule("sm90.wgmma_tma")->supports(int4, GpuArch::sm90a, InputType::f16);
  CHECK_FALSE(sm90.supported);
  // int8 with Q smoothing runs on the full schedule too; smoothing over the sequence or an unquantized Q does not.
  AttentionVariant smooth_q = test::presetVariant("sage-b");
  smooth_q.smooth_q = SmoothScope::block;
  CHECK(full.supports(smooth_q, GpuArch::sm80, InputType::f16).supported);
  smooth_q.smooth_q = SmoothScope::sequence;
  CHECK(full.supports(smooth_q, GpuArch::sm80, InputType::f16).reason.find("over the sequence") != std::string::npos);
  AttentionVariant exact_smooth_q = test::presetVariant("exact");
  exact_smooth_q.smooth_q = SmoothScope::block;
  CHECK(full.supports(exact_smooth_q, GpuArch::sm80, InputType::f16).reason.find("quantized Q") != std::string::npos);
  // Mixed code types.
  AttentionVariant mixed = int4;
  mixed.k.dtype = ElementType::int8;
  CHECK(full.supports(mixed, GpuArch::sm89, InputType::f16).reason.find("one type") != std::string::npos);
}

TEST_CASE("issue 11: the registered sm80 schedule runs FP4 by emulation (the legalized program's f16/bf16 operands)") {
  const Sm80Schedule full = Sm80Schedule::full();
  struct Expected {
    const char *name;
    ElementType decoded;
    int group;
    bool two_level;
  };
  for (const Expected &expected :
       {Expected{"sage3-fp4", ElementType::f16, 16, true}, Expected{"sage3-fp4-direct-p", ElementType::f16, 16, false},
        Expected{"sage3-mxfp4", ElementType::bf16, 32, false}})
    for (int head_dim : {64, 128})
      for (GpuArch arch : kArchs) {
        CAPTURE(expected.name);
        CAPTURE(head_dim);
        CAPTURE(archName(arch));
        const AttentionVariant variant = test::presetVariant(expected.name, head_dim);
        const SupportResult support = full.supports(variant, arch, InputType::f16);
        // Where the legalization decodes FP4: everywhere but on the block-scaled mma.sync (sm_120f).
        CHECK(support.supported == !hasFp4BlockScaledMma(arch));
        if (!support.supported) {
          CHECK(support.reason.find("multiplies FP4 natively") != std::string::npos);
          continue;
        }
        const KernelPlan plan = full.plan(variant, arch, InputType::f16);
        CHECK(plan.pv_path == PvPath::e2m1_decoded);
        CHECK(plan.qk_operand == ElementType::e2m1);
        CHECK(plan.qk_mma == MmaShape{16, 8, 16, expected.decoded, expected.decoded, AccumulatorType::f32});
        CHECK(plan.pv_mma == plan.qk_mma);
        CHECK(plan.v_source == ValueSource::workspace_codes);
        CHECK_FALSE(plan.interleave_kv_tokens);
        CHECK_FALSE(plan.q_scales.used); // the decode applies the microscales: S needs no dequantization
        CHECK(plan.fp4_scale_group == expected.group);
        CHECK(plan.fp4_two_level_p == expected.two_level);
        CHECK(plan.fp4_delta_s);
        CHECK(plan.k_codes_token_order == KCodesTokenOrder::natural);
        CHECK_FALSE(plan.fp4_permute_k_rows_in_shared);
        CHECK(plan.tunables.block_kv == variant.block_kv);
        // Shared memory: the decoded Q, then the decoded K_j / V_j^T (Q_i's codes and scales staged in their bytes),
        // then the stages of K_j codes, K_j scales and V_j^T codes.
        const SharedMemoryLayout &shared = plan.shared;
        const int value_bytes = 2, d = head_dim, b_kv = plan.tunables.block_kv, b_q = plan.tunables.block_q;
        CHECK(shared.q.row_bytes == d * value_bytes);
        CHECK(shared.decoded_k.offset >= shared.q.offset + shared.q.bytes);
        CHECK(shared.decoded_k.row_bytes == d * value_bytes);
        CHECK(shared.decoded_v.rows == d);
        CHECK(shared.decoded_v.row_bytes == b_kv * value_bytes);
        CHECK(shared.q_codes.offset == shared.decoded_k.offset);
        CHECK(shared.q_scales.offset >= shared.q_codes.offset + b_q * d / 2);
        CHECK(shared.stage_offset >= shared.decoded_v.offset + shared.decoded_v.bytes);
        CHECK(shared.stage_offset >= shared.q_scales.offset + b_q * d / expected.group);
        CHECK(shared.k.row_bytes == d / 2);
        CHECK(shared.k_scales.row_bytes == d / expected.group);
        CHECK(shared.v.rows == d);
        CHECK(shared.v.row_bytes == b_kv / 2);
        CHECK(shared.total_bytes == shared.stage_offset + shared.stages * shared.stage_bytes);
        CHECK(shared.total_bytes <= gpuLimits(arch).max_dynamic_shared_bytes_per_block);
        // The registry's instance is the full one: the sm80 schedule is the one that runs them, also on sm_90a.
        CHECK(planBestSchedule(variant, arch, InputType::f16).schedule == Sm80Schedule::kName);
      }
  // A default Sm80Schedule (the sm90 schedule's numerics check) refuses FP4, and so does the sm90 schedule.
  const AttentionVariant fp4 = test::presetVariant("sage3-fp4");
  CHECK(reasonFor(fp4).find("FP4") != std::string::npos);
  CHECK_FALSE(findSchedule("sm90.wgmma_tma")->supports(fp4, GpuArch::sm90a, InputType::f16).supported);
  // P's two-level scale is per S tile: the tile must be the variant's.
  Tunables narrow = full.plan(fp4, GpuArch::sm90a, InputType::f16).tunables;
  narrow.block_kv = fp4.block_kv / 2;
  CHECK_THROWS_WITH_AS(full.plan(fp4, GpuArch::sm90a, InputType::f16, narrow),
                       doctest::Contains("FP4 P is quantized per S tile"), std::invalid_argument);
  // Why not, for each operand that breaks the format.
  const auto reason = [&](const AttentionVariant &variant) {
    return full.supports(variant, GpuArch::sm90a, InputType::f16).reason;
  };
  AttentionVariant mixed_scales = fp4;
  mixed_scales.k.granularity = Granularity::microscale_1x32;
  mixed_scales.k.scale_type = ScaleType::ue8m0;
  CHECK(reason(mixed_scales).find("K must be quantized as Q") != std::string::npos);
  AttentionVariant fp4_pv_only = test::presetVariant("sage-b");
  fp4_pv_only.p = fp4.p;
  fp4_pv_only.v = fp4.v;
  CHECK(reason(fp4_pv_only).find("Q must be e2m1") != std::string::npos);
  AttentionVariant int8_p = fp4;
  int8_p.p = test::presetVariant("sage-vb").p;
  CHECK(reason(int8_p).find("P must be quantized as Q and K") != std::string::npos);
  AttentionVariant smooth_v = fp4;
  smooth_v.smooth_v = SmoothScope::sequence;
  CHECK(reason(smooth_v).find("smoothed V") != std::string::npos);
  AttentionVariant two_level_accumulation = fp4;
  two_level_accumulation.accumulation = {AccumulationKind::f32_two_level, 4};
  CHECK(reason(two_level_accumulation).find("accumulation must be f32") != std::string::npos);
}
