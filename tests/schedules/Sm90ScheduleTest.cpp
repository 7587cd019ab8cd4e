// The sm90 wgmma + TMA schedule: where it runs, what it plans, and how it refuses.
#include "sage/schedules/Sm90Schedule.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm80Schedule.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <optional>

using namespace sage;
using namespace sage::schedules;

TEST_CASE("sm90 runs only on sm_90a, where it ranks first") {
  const Sm90Schedule sm90;
  const AttentionVariant variant = test::presetVariant("sage2-fp8", 128);
  CHECK(sm90.supports(variant, GpuArch::sm90a, InputType::f16));
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm100f, GpuArch::sm120f}) {
    const SupportResult verdict = sm90.supports(variant, arch, InputType::f16);
    CHECK_FALSE(verdict);
    CHECK(verdict.reason.find("has no wgmma") != std::string::npos);
  }
  CHECK(bestSchedule(variant, GpuArch::sm90a, InputType::f16).name() == Sm90Schedule::kName);
  CHECK(bestSchedule(variant, GpuArch::sm89, InputType::f16).name() == "sm80.mma_sync");
}

TEST_CASE("sm90 runs block-sparse masks whose blocks its tiles can be, and sm80 runs the others") {
  const Sm90Schedule sm90;
  SUBCASE("128 x 64 blocks (the presets' own): two consumer warpgroups share the CTA's mask row") {
    const AttentionVariant sparse = test::presetVariant("sage-b", 128, MaskKind::block_sparse);
    CHECK(sm90.supports(sparse, GpuArch::sm90a, InputType::f16));
    CHECK(bestSchedule(sparse, GpuArch::sm90a, InputType::f16).name() == Sm90Schedule::kName);
    const KernelPlan plan = sm90.plan(sparse, GpuArch::sm90a, InputType::f16);
    CHECK(plan.block_sparse);
    CHECK(plan.tunables.block_q == 128);
    CHECK(plan.tunables.block_kv == 64);
    CHECK(plan.warp_specialization.consumer_warpgroups == 2);
    CHECK(plan.grid.block_q == 128);
    // The mask row's bitmask (16384 blocks, 2 KiB) is part of shared memory: the dense plan is that much smaller.
    const KernelPlan dense =
        sm90.plan(test::presetVariant("sage-b", 128), GpuArch::sm90a, InputType::f16, plan.tunables);
    CHECK_FALSE(dense.block_sparse);
    CHECK(plan.shared.total_bytes == dense.shared.total_bytes + 2048);
  }
  SUBCASE("SLA's 64 x 64 blocks (its sparse part, f16 and int8 Q.K^T): one consumer warpgroup") {
    for (const char *preset : {"sla-f16", "sla-int8"}) {
      CAPTURE(preset);
      AttentionVariant sparse = test::presetVariant(preset, 128);
      sparse.sla = SlaSpec{};
      REQUIRE(sparse.mask.kind == MaskKind::block_sparse);
      CHECK(bestSchedule(sparse, GpuArch::sm90a, InputType::f16).name() == Sm90Schedule::kName);
      const KernelPlan plan = sm90.plan(sparse, GpuArch::sm90a, InputType::f16);
      CHECK(plan.tunables.block_q == 64);
      CHECK(plan.tunables.block_kv == 64);
      CHECK(plan.tunables.warps == 4);
      CHECK(plan.threads == 256);
      CHECK(plan.grid.block_q == 64);
      CHECK_FALSE(plan.grid.reverse_q_blocks);
      // Two CTAs per SM: shared memory for both, and the producer's registers handed to the consumer
      CHECK(plan.min_blocks_per_multiprocessor == 2);
      CHECK(2 * (plan.shared.total_bytes + 1024) <= 228 * 1024);
      CHECK(plan.warp_specialization.producer_registers == 24);
      CHECK(plan.warp_specialization.consumer_registers == 232);
    }
    AttentionVariant sparse = test::presetVariant("sla-f16", 128);
    sparse.sla = SlaSpec{};
    // f16 Q/K at d = 128: 16 KiB of Q and 32 KiB stages, so two CTAs fit with 2 stages (the default gives up 4 -> 2)
    CHECK(sm90.plan(sparse, GpuArch::sm90a, InputType::f16).tunables.stages == 2);
    // Explicit tunables keep their stages: 4 do not fit twice, so one CTA per SM and no hand-over
    const KernelPlan deep = sm90.plan(sparse, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 4, 4});
    CHECK(deep.tunables.stages == 4);
    CHECK(deep.min_blocks_per_multiprocessor == 1);
    CHECK(deep.warp_specialization.producer_registers == 0);
    // int8 Q/K: 4 stages of 24 KiB fit twice
    AttentionVariant int8_sparse = test::presetVariant("sla-int8", 128);
    int8_sparse.sla = SlaSpec{};
    const KernelPlan int8_plan = sm90.plan(int8_sparse, GpuArch::sm90a, InputType::f16);
    CHECK(int8_plan.tunables.stages == 4);
    CHECK(int8_plan.min_blocks_per_multiprocessor == 2);
  }
  SUBCASE("blocks no sm90 tile equals: refused with the reason, sm80 runs them") {
    AttentionVariant sparse = test::presetVariant("sage-b", 128, MaskKind::block_sparse);
    sparse.block_q = 32;
    SupportResult verdict = sm90.supports(sparse, GpuArch::sm90a, InputType::f16);
    CHECK_FALSE(verdict);
    CHECK(verdict.reason.find("block_q 32") != std::string::npos);
    CHECK(verdict.reason.find("64 per consumer warpgroup") != std::string::npos);
    sparse.block_q = 256;
    CHECK_FALSE(sm90.supports(sparse, GpuArch::sm90a, InputType::f16));
    sparse.block_q = 64;
    sparse.block_kv = 32;
    verdict = sm90.supports(sparse, GpuArch::sm90a, InputType::f16);
    CHECK_FALSE(verdict);
    CHECK(verdict.reason.find("block_kv 32") != std::string::npos);
    CHECK(bestSchedule(sparse, GpuArch::sm90a, InputType::f16).name() == "sm80.mma_sync");
  }
}

TEST_CASE("sm90 block-sparse tunables must be the mask's blocks; the tunable space offers only those") {
  const Sm90Schedule sm90;
  const AttentionVariant sparse = test::presetVariant("sage-b", 128, MaskKind::block_sparse);
  auto plan = [&](Tunables tunables) { return sm90.plan(sparse, GpuArch::sm90a, InputType::f16, tunables); };
  CHECK(plan({128, 64, 8, 3}).tunables.stages == 3);
  CHECK_THROWS_WITH_AS(plan({64, 64, 4, 2}), doctest::Contains("its own blocks (128x64)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({128, 128, 8, 2}), doctest::Contains("tunables.block_q/block_kv"), std::invalid_argument);
  const TunableSpace space = sm90.tunableSpace(sparse, GpuArch::sm90a, InputType::f16);
  CHECK(space.defaults == Tunables{128, 64, 8, 4});
  REQUIRE(space.candidates.size() == 7); // stages 2..8
  for (const TunableCandidate &candidate : space.candidates) {
    CHECK(candidate.tunables.block_q == 128);
    CHECK(candidate.tunables.block_kv == 64);
    CHECK(candidate.tunables.warps == 8);
  }
}

TEST_CASE("sm90 plans: warp roles, wgmma shapes, V's source and the TMA boxes") {
  const Sm90Schedule sm90;
  SUBCASE("sage2-fp8 d128: int8 Q.K^T, e4m3 P.V against V^T codes in wgmma token order") {
    const KernelPlan plan = sm90.plan(test::presetVariant("sage2-fp8", 128), GpuArch::sm90a, InputType::f16);
    CHECK(plan.schedule == Sm90Schedule::kName);
    // Two-level accumulation keeps both sums of O in registers: one consumer warpgroup per CTA that issues its own
    // loads (no producer warpgroup), three CTAs per SM, one tile each.
    CHECK(plan.tunables.inline_loads);
    CHECK(plan.threads == 128);
    CHECK_FALSE(plan.warp_specialization.producer_warpgroup);
    CHECK(plan.warp_specialization.consumer_warpgroups == 1);
    CHECK(plan.min_blocks_per_multiprocessor == 3);
    CHECK(plan.grid.persistent_ctas_per_multiprocessor == 0);
    CHECK(plan.warp_specialization.producer_registers == 0);
    CHECK(plan.warp_specialization.consumer_registers == 0); // no setmaxnreg: __launch_bounds__ caps them
    CHECK(plan.qk_mma == MmaShape{64, 128, 32, ElementType::int8, ElementType::int8, AccumulatorType::s32});
    CHECK(plan.pv_mma == MmaShape{64, 128, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32});
    CHECK(plan.v_source == ValueSource::workspace_codes);
    CHECK(plan.wgmma_value_token_order);
    CHECK(plan.warp_specialization.q_box == TensorMapBox{128, 64});
    CHECK(plan.warp_specialization.k_box == TensorMapBox{128, 128});
    CHECK(plan.tunables.block_kv == 128);
    CHECK(plan.tunables.stages == 2); // 3 do not fit three times in shared memory
    CHECK(3 * (plan.shared.total_bytes + 1024) <= 228 * 1024);
    // With the producer warpgroup (inline_loads off): two persistent CTAs per SM, the producer's registers handed over
    Tunables with_producer = plan.tunables;
    with_producer.inline_loads = false;
    with_producer.stages = 3;
    const KernelPlan produced =
        sm90.plan(test::presetVariant("sage2-fp8", 128), GpuArch::sm90a, InputType::f16, with_producer);
    CHECK(produced.threads == 256);
    CHECK(produced.warp_specialization.producer_warpgroup);
    CHECK(produced.min_blocks_per_multiprocessor == 2);
    CHECK(produced.grid.persistent_ctas_per_multiprocessor == 2);
    CHECK(produced.warp_specialization.producer_registers == 24);
    CHECK(produced.warp_specialization.consumer_registers == 232);
    // The preset flushes every 2 of its 64-token blocks (128 tokens): after each of the kernel's, whose product is
    // folded into the f32 sum before the next softmax (the product, the sum and a 64 x 128 S do not fit the
    // registers together).
    CHECK(plan.two_level_flush_blocks == 1);
    CHECK_FALSE(plan.warp_specialization.softmax_under_product);
    CHECK(plan.warp_specialization.v_box == TensorMapBox{128, 128}); // 128 tokens of 128 channel rows
    // With 64-token blocks the kernel flushes every 2 and runs the softmax while the previous block's P.V does.
    const KernelPlan narrow =
        sm90.plan(test::presetVariant("sage2-fp8", 128), GpuArch::sm90a, InputType::f16, Tunables{128, 64, 8, 8});
    CHECK(narrow.two_level_flush_blocks == 2);
    CHECK(narrow.warp_specialization.softmax_under_product);
    CHECK(narrow.warp_specialization.consumer_warpgroups == 2);
  }
  SUBCASE("dense kernels are persistent, block-sparse ones take one tile per CTA") {
    const KernelPlan dense = sm90.plan(test::presetVariant("sage-b", 128), GpuArch::sm90a, InputType::f16);
    CHECK(dense.grid.persistent_ctas_per_multiprocessor == 1);
    const ProblemShape shape{2, 16, 16, 4096, 4096, 128};
    CHECK(dense.grid.tilesFor(shape) == 32 * 16 * 2);
    CHECK(dense.grid.gridFor(shape, 132) == std::array<int64_t, 3>{132, 1, 1});
    CHECK(dense.grid.gridFor({1, 1, 1, 256, 256, 128}, 132) == std::array<int64_t, 3>{2, 1, 1}); // fewer tiles
    CHECK(dense.grid.gridFor(shape) == std::array<int64_t, 3>{1024, 1, 1}); // no SM count: a CTA per tile
    const KernelPlan sparse =
        sm90.plan(test::presetVariant("sage-b", 128, MaskKind::block_sparse), GpuArch::sm90a, InputType::f16);
    CHECK(sparse.grid.persistent_ctas_per_multiprocessor == 0);
    CHECK(sparse.grid.gridFor(shape, 132) == std::array<int64_t, 3>{32, 16, 2});
  }
  SUBCASE("sage-b d64 bf16: f16 P.V reads the workspace's f16 V, 64-byte swizzled Q/K rows") {
    const KernelPlan plan = sm90.plan(test::presetVariant("sage-b", 64), GpuArch::sm90a, InputType::bf16);
    CHECK(plan.pv_path == PvPath::f16_accumulate_f16);
    CHECK(plan.v_source == ValueSource::workspace_values);
    CHECK_FALSE(plan.wgmma_value_token_order);
    CHECK(plan.warp_specialization.q_box == TensorMapBox{64, 128});
    CHECK(plan.warp_specialization.v_box == TensorMapBox{128, 128}); // 64 f16 channels of 128 token rows
  }
  SUBCASE("exact d128: f16 Q/K, and the pipeline shortened until shared memory fits") {
    const KernelPlan plan = sm90.plan(test::presetVariant("exact", 128), GpuArch::sm90a, InputType::f16);
    CHECK(plan.qk_mma == MmaShape{64, 128, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32});
    CHECK(plan.v_source == ValueSource::input);
    CHECK(plan.tunables.stages == 3); // 32 KiB of Q + 3 x 64 KiB of K/V stages
    CHECK(plan.shared.total_bytes <= 227 * 1024);
  }
}

TEST_CASE("sm90 tunables are checked, naming the tunable") {
  const Sm90Schedule sm90;
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  auto plan = [&](Tunables tunables) { return sm90.plan(variant, GpuArch::sm90a, InputType::f16, tunables); };
  CHECK_THROWS_WITH_AS(plan({128, 128, 6, 2}), doctest::Contains("tunables.warps"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({128, 128, 4, 2}), doctest::Contains("tunables.block_q"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({128, 32, 8, 2}), doctest::Contains("tunables.block_kv"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({128, 128, 8, 9}), doctest::Contains("tunables.stages"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({192, 128, 12, 8}), doctest::Contains("bytes of shared memory"), std::invalid_argument);
  CHECK(plan({64, 64, 4, 2}).threads == 256);
  // One consumer warpgroup: two CTAs per SM, the producer's registers handed to the consumer, a persistent grid of two
  // CTAs per SM; with 4 stages of 16 KiB they no longer fit twice, and one CTA keeps its registers.
  const KernelPlan shared = plan({64, 64, 4, 2});
  CHECK(shared.min_blocks_per_multiprocessor == 2);
  CHECK(shared.grid.persistent_ctas_per_multiprocessor == 2);
  CHECK(shared.warp_specialization.producer_registers == 24);
  CHECK(shared.warp_specialization.consumer_registers == 232);
  CHECK(plan({64, 128, 4, 4}).min_blocks_per_multiprocessor == 1);
  CHECK(plan({64, 128, 4, 4}).warp_specialization.producer_registers == 0);
  CHECK(plan({192, 128, 12, 2}).warp_specialization.consumer_registers == 160);
  // Inline loads: one consumer warpgroup and a dense mask only
  CHECK_THROWS_WITH_AS(plan({128, 128, 8, 2, true}), doctest::Contains("tunables.inline_loads"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sm90.plan(test::presetVariant("sage-b", 128, MaskKind::block_sparse), GpuArch::sm90a,
                                 InputType::f16, Tunables{64, 64, 4, 2, true}),
                       doctest::Contains("tunables.inline_loads"), std::invalid_argument);
  // Explicit stages are kept: 4 stages of 32 KiB fit once per SM, and the plan says so
  const KernelPlan deep = plan({64, 128, 4, 4, true});
  CHECK(deep.threads == 128);
  CHECK(deep.tunables.stages == 4);
  CHECK(deep.min_blocks_per_multiprocessor == 1);
  // sage-b's f16 V makes a 128-token stage 48 KiB: two CTAs fit, and so many are asked of the launch
  CHECK(plan({64, 128, 4, 2, true}).min_blocks_per_multiprocessor == 2);
  CHECK(plan({64, 64, 4, 2, true}).min_blocks_per_multiprocessor == 3);
  // ctas: the CTAs per SM an inline-loads kernel's registers are capped for, where shared memory holds them
  CHECK(plan({64, 64, 4, 2, true, 4}).min_blocks_per_multiprocessor == 3); // sage-b's 24 KiB stages: three fit
  CHECK(plan({64, 64, 4, 2, true, 2}).min_blocks_per_multiprocessor == 2);
  const KernelPlan four =
      sm90.plan(test::presetVariant("sage2-fp8", 64), GpuArch::sm90a, InputType::f16, Tunables{64, 128, 4, 2, true, 4});
  CHECK(four.min_blocks_per_multiprocessor == 4);
  CHECK(four.tunables.ctas == 4);
  CHECK_THROWS_WITH_AS(plan({64, 64, 4, 2, true, 5}), doctest::Contains("tunables.ctas: the CTAs per SM"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(plan({64, 64, 4, 2, false, 4}), doctest::Contains("without inline loads"),
                       std::invalid_argument);
}

TEST_CASE("sm90's tunable space: every candidate planned or refused with the schedule's reason") {
  const Sm90Schedule sm90;
  const TunableSpace space = sm90.tunableSpace(test::presetVariant("sage2-fp8", 128), GpuArch::sm90a, InputType::f16);
  CHECK(space.schedule == Sm90Schedule::kName);
  CHECK(space.defaults == Tunables{64, 128, 4, 2, true}); // three CTAs per SM: 8 KiB of Q + 2 x 32 KiB of K/V each
  int supported = 0;
  for (const TunableCandidate &candidate : space.candidates) {
    supported += candidate.verdict ? 1 : 0;
    if (!candidate.verdict)
      CHECK(candidate.verdict.reason.find("shared memory") != std::string::npos);
  }
  CHECK(supported > 10);
}

TEST_CASE("rotated variants (issue 28) run where the prologue rotates their Q and K codes, and are refused elsewhere") {
  const Sm90Schedule sm90;
  const auto rotated = [](AttentionVariant variant) {
    variant.q.rotation_seed = 5;
    variant.k.rotation_seed = 5;
    return variant;
  };
  for (const char *name : {"sage-b", "sage2-fp8", "sage-t"}) {
    CAPTURE(std::string(name));
    CHECK(sm90.supports(rotated(test::presetVariant(name, 128)), GpuArch::sm90a, InputType::f16));
    CHECK(bestSchedule(rotated(test::presetVariant(name, 64)), GpuArch::sm89, InputType::bf16).name() ==
          "sm80.mma_sync");
  }
  AttentionVariant per_tensor = test::presetVariant("sage-b", 128);
  per_tensor.q.granularity = per_tensor.k.granularity = Granularity::per_tensor;
  per_tensor.q.group_tokens = per_tensor.k.group_tokens = 0;
  CHECK(sm90.supports(per_tensor, GpuArch::sm90a, InputType::f16)); // the same variant unrotated runs
  for (GpuArch arch : {GpuArch::sm90a, GpuArch::sm89}) {
    int named = 0; // schedules that refuse it for the rotation (the others: for the arch)
    for (const ScheduleVerdict &verdict : scheduleVerdicts(rotated(per_tensor), arch, InputType::f16)) {
      CHECK_FALSE(verdict.support);
      named += verdict.support.reason.find("rotation: a per-tensor Q scale") != std::string::npos ? 1 : 0;
    }
    CHECK(named >= 1);
  }
}

TEST_CASE("sm90 head dims: 64, 128, 192 and 256; the others are refused, naming the dims it has") {
  const Sm90Schedule sm90;
  for (const char *preset : {"sage-b", "sage-t", "sage-vb", "sage-vt", "sage2-fp8", "exact"})
    for (int head_dim : {192, 256}) {
      CAPTURE(preset);
      CAPTURE(head_dim);
      CHECK(sm90.supports(test::presetVariant(preset, head_dim), GpuArch::sm90a, InputType::f16));
      CHECK(sm90.supports(test::presetVariant(preset, head_dim, MaskKind::causal), GpuArch::sm90a, InputType::bf16));
      CHECK(bestSchedule(test::presetVariant(preset, head_dim), GpuArch::sm90a, InputType::f16).name() ==
            Sm90Schedule::kName);
    }
  for (int head_dim : {32, 80, 96, 160, 224}) {
    CAPTURE(head_dim);
    const SupportResult verdict =
        sm90.supports(test::presetVariant("sage-b", head_dim), GpuArch::sm90a, InputType::f16);
    CHECK_FALSE(verdict);
    CHECK(verdict.reason.find("head_dim 64, 128, 192 and 256 only") != std::string::npos);
  }
  // Two-level accumulation beyond d = 128: the mma.sync schedule refuses it (two f32 copies of O), this one folds
  // O's column slices.
  const AttentionVariant fp8 = test::presetVariant("sage2-fp8", 256);
  CHECK_FALSE(Sm80Schedule().supports(fp8, GpuArch::sm90a, InputType::f16));
  CHECK(bestSchedule(fp8, GpuArch::sm90a, InputType::f16).name() == Sm90Schedule::kName);
  // Block-sparse kernels keep their tiles for 64 and 128
  const SupportResult sparse =
      sm90.supports(test::presetVariant("sage-b", 256, MaskKind::block_sparse), GpuArch::sm90a, InputType::f16);
  CHECK_FALSE(sparse);
  CHECK(sparse.reason.find("block-sparse kernels have tiles for head_dim 64 and 128 only") != std::string::npos);
  // The rotation's Hadamard matrix needs a power of two: 256 yes, 192 no
  auto rotated = [](AttentionVariant variant) {
    variant.q.rotation_seed = 5;
    variant.k.rotation_seed = 5;
    return variant;
  };
  CHECK(sm90.supports(rotated(test::presetVariant("sage-b", 256)), GpuArch::sm90a, InputType::f16));
}

TEST_CASE("sm90 plans at head_dim 192 and 256: column slices of P.V, inline loads for an outer sum, narrow chunks") {
  const Sm90Schedule sm90;
  const auto plan = [&](const char *preset, int head_dim, std::optional<Tunables> tunables = {}) {
    return sm90.plan(test::presetVariant(preset, head_dim), GpuArch::sm90a, InputType::f16, tunables);
  };
  SUBCASE("sage2-fp8 d256: one consumer with inline loads, 64-token blocks, two CTAs per SM, n128 slices") {
    const KernelPlan fp8 = plan("sage2-fp8", 256);
    CHECK(fp8.tunables.inline_loads);
    CHECK(fp8.tunables.block_kv == 64);
    CHECK(fp8.tunables.ctas == 2);
    CHECK(fp8.threads == 128);
    CHECK(fp8.min_blocks_per_multiprocessor == 2);
    CHECK(2 * (fp8.shared.total_bytes + 1024) <= 228 * 1024);
    CHECK(fp8.two_level_flush_blocks == 1); // each block's product folded slice by slice
    CHECK(fp8.pv_mma == MmaShape{64, 128, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32});
    CHECK(fp8.warp_specialization.q_box == TensorMapBox{128, 64}); // 256-byte rows: two 128-byte chunks
    CHECK(fp8.warp_specialization.v_box == TensorMapBox{64, 256}); // V^T: 256 channel rows of 64 tokens
  }
  SUBCASE("d192: int8 rows of 192 bytes in 64-byte chunks; 8-bit P.V in two n96 slices, f16 V in 64-channel ones") {
    const KernelPlan fp8 = plan("sage2-fp8", 192);
    CHECK(fp8.warp_specialization.q_box == TensorMapBox{64, 64});
    CHECK(fp8.warp_specialization.k_box == TensorMapBox{64, 64});
    CHECK(fp8.pv_mma.n == 96);
    CHECK(plan("sage-vb", 192).pv_mma.n == 96);
    const KernelPlan exact = plan("exact", 192); // f16 Q/K: 384-byte rows, three 128-byte chunks
    CHECK(exact.warp_specialization.q_box == TensorMapBox{128, 128});
    CHECK(exact.pv_mma.n == 64);
    CHECK(exact.warp_specialization.consumer_warpgroups == 2);
    CHECK(exact.tunables.block_kv == 64);
  }
  SUBCASE("f16 O: two consumers taking turns, one wgmma of n = d") {
    const KernelPlan wide = plan("sage-b", 256);
    CHECK(wide.warp_specialization.consumer_warpgroups == 2);
    CHECK_FALSE(wide.tunables.inline_loads);
    CHECK(wide.tunables.block_kv == 64);
    CHECK(wide.pv_mma.n == 256);
    CHECK(wide.warp_specialization.v_box == TensorMapBox{128, 64}); // 64 f16 channels of 64 token rows
    CHECK(wide.shared.total_bytes <= 227 * 1024);
    const KernelPlan narrow = plan("sage-b", 192);
    CHECK(narrow.tunables.block_kv == 128);
    CHECK(narrow.pv_mma.n == 192);
    CHECK(plan("sage-t", 256).warp_specialization.consumer_warpgroups == 2);
    // An f32 O at d = 256 does not fit beside the turns: one consumer with inline loads
    CHECK(plan("exact", 256).tunables.inline_loads);
    CHECK(plan("exact", 256).pv_mma.n == 128);
  }
  SUBCASE("an outer sum beyond d = 128 needs inline loads and at most two CTAs per SM; the tunables say so") {
    CHECK_THROWS_WITH_AS(plan("sage-vb", 256, Tunables{64, 64, 4, 2}), doctest::Contains("tunables.inline_loads"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(plan("sage2-fp8", 192, Tunables{64, 64, 4, 2, true}),
                         doctest::Contains("tunables.ctas: at head_dim 192"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(plan("sage2-fp8", 256, Tunables{64, 64, 4, 2, true, 4}), doctest::Contains("expected 1 or 2"),
                         std::invalid_argument);
    CHECK(plan("sage2-fp8", 256, Tunables{64, 64, 4, 2, true, 1}).min_blocks_per_multiprocessor == 1);
  }
  SUBCASE("the tunable space lists the defaults and refuses the rest with reasons") {
    const TunableSpace space = sm90.tunableSpace(test::presetVariant("sage2-fp8", 256), GpuArch::sm90a, InputType::f16);
    CHECK(space.defaults == plan("sage2-fp8", 256).tunables);
    bool defaults_listed = false;
    int supported = 0;
    for (const TunableCandidate &candidate : space.candidates) {
      supported += candidate.verdict ? 1 : 0;
      defaults_listed = defaults_listed || (candidate.verdict && candidate.tunables == space.defaults);
      if (!candidate.verdict)
        CHECK(!candidate.verdict.reason.empty());
      if (candidate.verdict)
        CHECK(candidate.tunables.inline_loads);
    }
    CHECK(defaults_listed);
    CHECK(supported >= 4);
  }
}
