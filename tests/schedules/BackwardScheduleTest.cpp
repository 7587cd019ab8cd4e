// The backward schedules (SageBwd, issue 12; K smoothing, issue 25): what they support and why not, their plans, the
// workspace they need, and the generator's text and checks.
#include "sage/schedules/BackwardSchedule.h"
#include "sage/codegen/BackwardKernelGenerator.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/numerics/Hadamard.h"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <optional>

using namespace sage;
using namespace sage::schedules;

namespace {
BackwardVariant sagebwd(int head_dim = 128, MaskKind mask = MaskKind::none) {
  return dsl::backwardPreset("sagebwd", head_dim, mask)->describe();
}
} // namespace

TEST_CASE("the sm80 backward schedule supports Algorithm 3 and says why not otherwise") {
  const Sm80BackwardSchedule schedule;
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a})
    for (int head_dim : {64, 128})
      CHECK(schedule.supports(sagebwd(head_dim, MaskKind::causal), arch, InputType::f16));
  CHECK(schedule.supports(dsl::backwardPreset("sagebwd")->float_type(ElementType::bf16).describe(), GpuArch::sm80,
                          InputType::bf16));
  auto reason = [&](const BackwardVariant &variant, InputType input = InputType::f16) {
    return schedule.supports(variant, GpuArch::sm80, input).reason;
  };
  CHECK(reason(sagebwd(), InputType::bf16).find("input type (bf16)") != std::string::npos);
  CHECK(reason(dsl::backwardPreset("sagebwd-int8-dp")->describe()).find("CPU reference only") != std::string::npos);
  CHECK(reason(dsl::backwardPreset("exact-bwd")->describe()).find("S = Q.K^T") != std::string::npos);
  CHECK(reason(sagebwd(96)).find("head_dim 96") != std::string::npos);
  BackwardVariant per_block_mean = sagebwd();
  per_block_mean.smooth_k = SmoothScope::block;
  CHECK(reason(per_block_mean).find("K smoothed per block") != std::string::npos);
  CHECK(reason(dsl::backwardPreset("sagebwd")->blocks(128, 64).describe()).find("64x64") != std::string::npos);
  CHECK_THROWS_WITH_AS(schedule.plan(sagebwd(96), GpuArch::sm80, InputType::f16), doctest::Contains("head_dim 96"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(bestBackwardSchedule(sagebwd(96), GpuArch::sm80, InputType::f16),
                       doctest::Contains("sm80.mma_sync_backward: head_dim 96"), std::invalid_argument);
  CHECK(&bestBackwardSchedule(sagebwd(), GpuArch::sm90a, InputType::f16) == allBackwardSchedules().front());
}

TEST_CASE("the plan: five launches, their grids, the main kernel's shared memory and the workspace") {
  const BackwardKernelPlan plan =
      Sm80BackwardSchedule().plan(sagebwd(128, MaskKind::causal), GpuArch::sm89, InputType::f16);
  REQUIRE(plan.launches.size() == 5);
  CHECK(plan.smooth_k);
  CHECK(plan.launches[0].entry_point == "sage_bwd_k_sums");
  CHECK(plan.launches[1].entry_point == "sage_bwd_preprocess_q");
  CHECK(plan.launches[3].entry_point == "sage_bwd_main");
  // Rows padded by 16 bytes: K^, Q^ [64][144]; K^^T, Q^^T, dO^^T [128][80]; V, dO [64][272]; 3 codes [64][80].
  CHECK(plan.launches[3].dynamic_shared_bytes == 2 * 64 * 144 + 3 * 128 * 80 + 2 * 64 * 272 + 3 * 64 * 80 + 144 * 4);
  CHECK(plan.launches[3].dynamic_shared_bytes <= 99 * 1024); // fits sm_89
  // K's column sums over at most 8 slices of whole 64-token blocks per KV head, fewer for short K
  CHECK(plan.launches[0].gridFor(2, 8, 2, 1000, 3000) == std::array<int64_t, 3>{8, 2, 2});
  CHECK(plan.launches[0].gridFor(2, 8, 2, 1000, 300) == std::array<int64_t, 3>{5, 2, 2});
  CHECK(plan.launches[1].gridFor(2, 8, 2, 1000, 3000) == std::array<int64_t, 3>{16, 8, 2});
  CHECK(plan.launches[3].gridFor(2, 8, 2, 1000, 3000) == std::array<int64_t, 3>{47, 2, 2});
  CHECK(plan.causal);
  const BackwardWorkspaceSizes sizes = backwardWorkspaceSizes(plan, 2, 8, 2, 1000, 3000);
  CHECK(sizes.q_codes == 2 * 8 * 16 * 64 * 128);
  CHECK(sizes.k_codes == 2 * 2 * 47 * 64 * 128);
  CHECK(sizes.dq_accum == 4 * 2 * 8 * 1024 * 128); // whole 64-row blocks
  CHECK(sizes.row_stats == 2 * 4 * 2 * 8 * 1024);
  CHECK(sizes.k_sums == 4 * 2 * 2 * 8 * 128);
  CHECK(backwardWorkspaceSizes(plan, 2, 8, 2, 1000, 300).k_sums == 4 * 2 * 2 * 5 * 128);
  CHECK(sizes.total() > sizes.dq_accum);
  CHECK(plan.describe().find("sm80.mma_sync_backward sm_89 f16 d128 causal") == 0);
  CHECK(plan.describe().find("smooth-k launches 5") != std::string::npos);

  // The ablation without K smoothing: the four launches of Algorithm 3, no column sums.
  const BackwardKernelPlan unsmoothed = Sm80BackwardSchedule().plan(
      dsl::backwardPreset("sagebwd", 128, MaskKind::causal)->smooth_k(false).describe(), GpuArch::sm89, InputType::f16);
  REQUIRE(unsmoothed.launches.size() == 4);
  CHECK_FALSE(unsmoothed.smooth_k);
  CHECK(unsmoothed.launches[0].entry_point == "sage_bwd_preprocess_q");
  CHECK(backwardWorkspaceSizes(unsmoothed, 2, 8, 2, 1000, 3000).k_sums == 0);
}

TEST_CASE("the main kernel takes two K blocks per CTA where the arch's shared memory allows") {
  const BackwardVariant variant = sagebwd(128, MaskKind::none);
  const BackwardKernelPlan sm89 = Sm80BackwardSchedule().plan(variant, GpuArch::sm89, InputType::f16);
  CHECK(sm89.kv_tile == 64);
  CHECK(sm89.launches[3].threads == 128);
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm90a}) {
    const BackwardKernelPlan plan = Sm80BackwardSchedule().plan(variant, arch, InputType::f16);
    CAPTURE(archName(arch));
    CHECK(plan.kv_tile == 128);
    CHECK(plan.warps == 8);
    const BackwardLaunch &main = plan.launches[3];
    CHECK(main.threads == 256);
    // K^ [128][144], Q^ [64][144]; K^^T x 2, Q^^T, dO^^T [128][80]; V [128][272], dO [64][272]; P^T, dS^T [128][80];
    // dS [64][144]; 128 row stats and 32 scratch floats
    CHECK(main.dynamic_shared_bytes == 192 * 144 + 4 * 128 * 80 + 192 * 272 + 2 * 128 * 80 + 64 * 144 + (128 + 32) * 4);
    CHECK(main.gridFor(2, 8, 2, 1000, 3000) == std::array<int64_t, 3>{24, 2, 2}); // 3000 keys in 128-key tiles
    CHECK(plan.launches[2].gridFor(2, 8, 2, 1000, 3000) == std::array<int64_t, 3>{47, 2, 2});
    CHECK(plan.launches[1].threads == 128);
    CHECK(plan.describe().find("(128 keys per CTA) warps 8") != std::string::npos);
  }
}

TEST_CASE("the backward kernel text instantiates the device library with the plan's constants") {
  const BackwardVariant variant = dsl::backwardPreset("sagebwd", 64)->float_type(ElementType::bf16).describe();
  const BackwardKernelPlan plan = Sm80BackwardSchedule().plan(variant, GpuArch::sm80, InputType::bf16);
  const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(variant, plan);
  CHECK(kernel.name == "sagebwd_d64_bf16_sm_80_sm80_mma_sync_backward");
  for (const char *text : {"#include \"sage/device/sm80/backward.cuh\"", "kHeadDim = 64", "kCausal = false",
                           "kBf16 = true", "sage_bwd_main(const SageBackwardParams params)", "kKeys = 128",
                           "kMainSharedBytes<SageBackwardConfig> == 93824", "kSmoothK = true", "kKMeanSlices = 8",
                           "sage_bwd_k_sums(const SageBackwardParams params)"}) {
    CAPTURE(text);
    CHECK(kernel.source.find(text) != std::string::npos);
  }
  // the ablation without K smoothing: its own name, no column sums
  const BackwardVariant unsmoothed =
      dsl::backwardPreset("sagebwd", 64)->float_type(ElementType::bf16).smooth_k(false).describe();
  const codegen::BackwardKernelSource ablation = codegen::BackwardKernelGenerator::generate(
      unsmoothed, Sm80BackwardSchedule().plan(unsmoothed, GpuArch::sm80, InputType::bf16));
  CHECK(ablation.name == "sagebwd_d64_bf16_sm_80_sm80_mma_sync_backward_unsmoothed_k");
  CHECK(ablation.source.find("kSmoothK = false") != std::string::npos);
  CHECK(ablation.source.find("sage_bwd_k_sums") == std::string::npos);
  CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(unsmoothed, plan),
                       doctest::Contains("K smoothing is not the variant's"), std::invalid_argument);
  BackwardKernelPlan other = plan;
  other.schedule = "sm100.tcgen05_backward";
  CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(variant, other),
                       doctest::Contains("no backward kernel writer for schedule 'sm100.tcgen05_backward'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(sagebwd(128), plan), doctest::Contains("head_dim"),
                       std::invalid_argument);
}

TEST_CASE("the sm90 wgmma backward schedule: sm_90a only, the mma.sync schedule's numerics, 128 keys per CTA") {
  const Sm90BackwardSchedule schedule;
  CHECK(schedule.supports(sagebwd(64, MaskKind::causal), GpuArch::sm90a, InputType::f16));
  CHECK(schedule.supports(sagebwd(128), GpuArch::sm90a, InputType::f16));
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm100f, GpuArch::sm120f})
    CHECK(schedule.supports(sagebwd(), arch, InputType::f16).reason.find("has no wgmma") != std::string::npos);
  CHECK(schedule.supports(sagebwd(96), GpuArch::sm90a, InputType::f16).reason.find("head_dim 96") != std::string::npos);
  CHECK(schedule.supports(dsl::backwardPreset("sagebwd-int8-dp")->describe(), GpuArch::sm90a, InputType::f16)
            .reason.find("CPU reference only") != std::string::npos);
  // the best schedule on sm_90a; elsewhere the mma.sync one
  CHECK(bestBackwardSchedule(sagebwd(), GpuArch::sm90a, InputType::f16).name() == "sm90.wgmma_backward");
  CHECK(bestBackwardSchedule(sagebwd(), GpuArch::sm89, InputType::f16).name() == "sm80.mma_sync_backward");

  for (int head_dim : {64, 128}) {
    const BackwardKernelPlan plan = schedule.plan(sagebwd(head_dim), GpuArch::sm90a, InputType::f16);
    CAPTURE(head_dim);
    REQUIRE(plan.launches.size() == 5);
    CHECK(plan.kv_tile == 128);
    const BackwardLaunch &main = plan.launches[3];
    CHECK(main.threads == 256);
    CHECK(main.tile_tokens == 128);
    // 1024-aligned tiles: K^ 128d, K^^T 2 x 64d, V 256d; 2 stages of {Q^ 64d, dO 128d, Q^^T 64d, dO^^T 64d, 512 B of
    // stats -> 1 KiB}; dS 8 KiB; the dQ tile 256d; 80 bytes of scratch and 2 mbarriers; 1 KiB to align the dynamic
    // buffer
    const int d = head_dim;
    CHECK(main.dynamic_shared_bytes ==
          128 * d + 128 * d + 256 * d + 2 * (320 * d + 1024) + 8192 + 256 * d + 80 + 16 + 1024);
    // the preprocess writes the Q-side tiles for bulk copies: the workspace holds a dO copy of whole 64-row blocks
    CHECK(plan.bulk_tiles);
    CHECK(backwardWorkspaceSizes(plan, 2, 8, 2, 1000, 3000).do_tiles == 2 * 2 * 8 * 1024 * head_dim);
    const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(
        sagebwd(head_dim), schedule.plan(sagebwd(head_dim), GpuArch::sm90a, InputType::f16));
    for (const std::string &text :
         {std::string("#include \"sage/device/sm90/backward.cuh\""), std::string("kWgmmaQueryOrder = true"),
          "kMainSharedBytes<SageBackwardConfig> == " + std::to_string(main.dynamic_shared_bytes)}) {
      CAPTURE(text);
      CHECK(kernel.source.find(text) != std::string::npos);
    }
  }
  CHECK_THROWS_WITH_AS(schedule.plan(sagebwd(), GpuArch::sm89, InputType::f16), doctest::Contains("has no wgmma"),
                       std::invalid_argument);
}

TEST_CASE("the rotated backward (issue 25): both schedules plan it, the Config carries the rotation") {
  const BackwardVariant rotated = dsl::backwardPreset("sagebwd-rot", 64, MaskKind::causal)->describe();
  for (const BackwardSchedule *schedule : allBackwardSchedules()) {
    CAPTURE(schedule->name());
    REQUIRE(schedule->supports(rotated, GpuArch::sm90a, InputType::f16));
    const BackwardKernelPlan plan = schedule->plan(rotated, GpuArch::sm90a, InputType::f16);
    CHECK(plan.rotation_seed == std::optional<uint32_t>(dsl::kDefaultRotationSeed));
    CHECK(plan.describe().find(" rotated") != std::string::npos);
    // No launch of its own: the preprocess rotates, write_dq and the main kernel's epilogue rotate back.
    CHECK(plan.launches.size() ==
          schedule->plan(sagebwd(64, MaskKind::causal), GpuArch::sm90a, InputType::f16).launches.size());
    const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(rotated, plan);
    CHECK(kernel.name.ends_with("_rot0"));
    CHECK(kernel.source.find("static constexpr bool kRotate = true;") != std::string::npos);
    // d = 64: e_Q = e_K = 3, and seed 0's first sign word (sage/numerics/Hadamard.h)
    CHECK(kernel.source.find("kRotationScaleQ = 0.125f, kRotationScaleK = 0.125f") != std::string::npos);
    CHECK(kernel.source.find(fmt::format("kRotationSigns0 = 0x{:016x}ull", numerics::hadamardSigns(0)[0])) !=
          std::string::npos);
    // The unrotated kernels say so, and carry no rotation constants.
    const codegen::BackwardKernelSource plain = codegen::BackwardKernelGenerator::generate(
        sagebwd(64, MaskKind::causal), schedule->plan(sagebwd(64, MaskKind::causal), GpuArch::sm90a, InputType::f16));
    CHECK(plain.source.find("static constexpr bool kRotate = false;") != std::string::npos);
    CHECK(plain.source.find("kRotationSigns0") == std::string::npos);
    // A plan that disagrees with the variant is refused.
    CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(sagebwd(64, MaskKind::causal), plan),
                         doctest::Contains("rotation"), std::invalid_argument);
  }
  const BackwardVariant d128 = dsl::backwardPreset("sagebwd-rot", 128)->describe();
  const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(
      d128, Sm80BackwardSchedule().plan(d128, GpuArch::sm80, InputType::f16));
  CHECK(kernel.source.find("kRotationScaleQ = 0.125f, kRotationScaleK = 0.0625f") != std::string::npos);
  // Q and K rotated with different seeds (a variant the IR refuses) is refused by the schedule too.
  BackwardVariant mismatched = d128;
  mismatched.product(BackwardProduct::s).rhs.rotation_seed = 5u;
  mismatched.product(BackwardProduct::dq).rhs.rotation_seed = 5u;
  CHECK(Sm80BackwardSchedule().supports(mismatched, GpuArch::sm80, InputType::f16).reason.find("one seed") !=
        std::string::npos);
}

TEST_CASE("per-key P/dS scales (issue 25, sagebwd-rot-ks): both schedules plan them, the wgmma one first on sm_90a") {
  for (int head_dim : {64, 128}) {
    CAPTURE(head_dim);
    const BackwardVariant per_key = dsl::backwardPreset("sagebwd-rot-ks", head_dim, MaskKind::causal)->describe();
    const BackwardVariant per_tile = dsl::backwardPreset("sagebwd-rot", head_dim, MaskKind::causal)->describe();
    CHECK(bestBackwardSchedule(per_key, GpuArch::sm90a, InputType::f16).name() == "sm90.wgmma_backward");
    CHECK(bestBackwardSchedule(per_key, GpuArch::sm89, InputType::f16).name() == "sm80.mma_sync_backward");
    for (const BackwardSchedule *schedule : allBackwardSchedules()) {
      CAPTURE(schedule->name());
      REQUIRE(schedule->supports(per_key, GpuArch::sm90a, InputType::f16));
      const BackwardKernelPlan plan = schedule->plan(per_key, GpuArch::sm90a, InputType::f16);
      CHECK(plan.key_scales);
      CHECK(plan.describe().find(" key-scales") != std::string::npos);
      const BackwardKernelPlan tile_plan = schedule->plan(per_tile, GpuArch::sm90a, InputType::f16);
      CHECK_FALSE(tile_plan.key_scales);
      // the same launches and shared memory: the per-key scales live in registers
      REQUIRE(plan.launches.size() == tile_plan.launches.size());
      for (size_t i = 0; i < plan.launches.size(); ++i)
        CHECK(plan.launches[i].dynamic_shared_bytes == tile_plan.launches[i].dynamic_shared_bytes);
      const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(per_key, plan);
      CHECK(kernel.name.ends_with("_key_scales"));
      CHECK(kernel.source.find("static constexpr bool kKeyScales = true;") != std::string::npos);
      CHECK(codegen::BackwardKernelGenerator::generate(per_tile, tile_plan)
                .source.find("static constexpr bool kKeyScales = false;") != std::string::npos);
      // A plan that disagrees with the variant's P/dS scales is refused, both ways.
      CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(per_tile, plan), doctest::Contains("P/dS scales"),
                           std::invalid_argument);
      CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(per_key, tile_plan),
                           doctest::Contains("P/dS scales"), std::invalid_argument);
    }
  }
}

TEST_CASE("per-query dS scales for dQ (issue 25, sagebwd-rot-qks): both schedules plan them with or without per-key "
          "scales, in more shared memory") {
  for (int head_dim : {64, 128})
    for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a}) {
      CAPTURE(head_dim);
      CAPTURE(archName(arch));
      const BackwardVariant per_tile = dsl::backwardPreset("sagebwd-rot", head_dim, MaskKind::causal)->describe();
      const BackwardVariant both = dsl::backwardPreset("sagebwd-rot-qks", head_dim, MaskKind::causal)->describe();
      const BackwardVariant query_only =
          dsl::backwardPreset("sagebwd-rot", head_dim, MaskKind::causal)->token_scales(false, true).describe();
      CHECK(bestBackwardSchedule(both, arch, InputType::f16).name() ==
            bestBackwardSchedule(per_tile, arch, InputType::f16).name());
      for (const BackwardSchedule *schedule : allBackwardSchedules()) {
        CAPTURE(schedule->name());
        const bool supported = bool(schedule->supports(per_tile, arch, InputType::f16));
        CHECK(bool(schedule->supports(both, arch, InputType::f16)) == supported);
        CHECK(bool(schedule->supports(query_only, arch, InputType::f16)) == supported);
        if (!supported)
          continue;
        const BackwardKernelPlan tile_plan = schedule->plan(per_tile, arch, InputType::f16);
        const BackwardKernelPlan plan = schedule->plan(both, arch, InputType::f16);
        const BackwardKernelPlan query_plan = schedule->plan(query_only, arch, InputType::f16);
        CHECK(plan.key_scales);
        CHECK(plan.query_scales);
        CHECK_FALSE(query_plan.key_scales);
        CHECK(query_plan.query_scales);
        CHECK_FALSE(tile_plan.query_scales);
        CHECK(plan.describe().find(" key-scales query-scales") != std::string::npos);
        CHECK(tile_plan.describe().find("query-scales") == std::string::npos);
        // the same launches; the main kernel's shared memory grows by the warps' per-query maxima
        REQUIRE(plan.launches.size() == tile_plan.launches.size());
        for (size_t i = 0; i < plan.launches.size(); ++i) {
          const bool main = plan.launches[i].entry_point == "sage_bwd_main";
          CHECK((plan.launches[i].dynamic_shared_bytes > tile_plan.launches[i].dynamic_shared_bytes) == main);
          CHECK(query_plan.launches[i].dynamic_shared_bytes == plan.launches[i].dynamic_shared_bytes);
        }
        const codegen::BackwardKernelSource kernel = codegen::BackwardKernelGenerator::generate(both, plan);
        CHECK(kernel.name.ends_with("_key_scales_query_scales"));
        CHECK(kernel.source.find("static constexpr bool kQueryScales = true;") != std::string::npos);
        CHECK(codegen::BackwardKernelGenerator::generate(per_tile, tile_plan)
                  .source.find("static constexpr bool kQueryScales = false;") != std::string::npos);
        // A plan that disagrees with the variant's dS scales for dQ is refused, both ways.
        CHECK_THROWS_WITH_AS(
            codegen::BackwardKernelGenerator::generate(
                both, schedule->plan(dsl::backwardPreset("sagebwd-rot-ks", head_dim, MaskKind::causal)->describe(),
                                     arch, InputType::f16)),
            doctest::Contains("dS scales for dQ"), std::invalid_argument);
        CHECK_THROWS_WITH_AS(codegen::BackwardKernelGenerator::generate(per_tile, query_plan),
                             doctest::Contains("dS scales for dQ"), std::invalid_argument);
      }
    }
}
