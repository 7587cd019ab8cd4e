// The sm120 FP4 schedule: where it runs, what it plans, what it refuses and why, and its tunable space.
#include "sage/schedules/Sm120Schedule.h"
#include "sage/schedules/ScheduleRegistry.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using namespace sage;
using namespace sage::schedules;

namespace {

bool mentions(const SupportResult &verdict, const std::string &text) {
  return !verdict.supported && verdict.reason.find(text) != std::string::npos;
}

} // namespace

TEST_CASE("sm120 runs the FP4 presets on sm_120f only, where it ranks first") {
  const Sm120Schedule sm120;
  for (const char *preset : {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4"})
    for (InputType input : {InputType::f16, InputType::bf16}) {
      CAPTURE(preset);
      const AttentionVariant variant = test::presetVariant(preset, 128, MaskKind::causal, true);
      CHECK(sm120.supports(variant, GpuArch::sm120f, input));
      CHECK(bestSchedule(variant, GpuArch::sm120f, input).name() == Sm120Schedule::kName);
      // sm_100f: ptxas has no block-scaled mma.sync there; the reason says so.
      CHECK(mentions(sm120.supports(variant, GpuArch::sm100f, input), "ptxas 13.0 rejects"));
      for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a})
        CHECK(mentions(sm120.supports(variant, arch, input), "has no block-scaled FP4 mma.sync"));
    }
  CHECK(sm120.preference(GpuArch::sm120f) > sm120.preference(GpuArch::sm90a));
  const std::vector<ScheduleVerdict> verdicts =
      scheduleVerdicts(test::presetVariant("sage3-fp4", 64), GpuArch::sm120f, InputType::f16);
  REQUIRE(!verdicts.empty());
  CHECK(verdicts[0].schedule == Sm120Schedule::kName);
}

TEST_CASE("sm120 refuses what is not FP4 on both matmuls, naming what is missing") {
  const Sm120Schedule sm120;
  // Not FP4 at all: the int8 presets keep sm80 on sm_120f.
  const AttentionVariant int8 = test::presetVariant("sage-b", 128);
  CHECK(mentions(sm120.supports(int8, GpuArch::sm120f, InputType::f16), "FP4 Q.K^T only"));
  CHECK(bestSchedule(int8, GpuArch::sm120f, InputType::f16).name() == "sm80.mma_sync");

  const AttentionVariant nvfp4 = test::presetVariant("sage3-fp4", 128);
  const AttentionVariant mxfp4 = test::presetVariant("sage3-mxfp4", 128);
  AttentionVariant mixed = nvfp4; // NVFP4 Q/K with MXFP4 P
  mixed.p = mxfp4.p;
  CHECK(mentions(sm120.supports(mixed, GpuArch::sm120f, InputType::f16), "P must be quantized as Q and K"));
  mixed = nvfp4;
  mixed.k = mxfp4.k;
  CHECK(mentions(sm120.supports(mixed, GpuArch::sm120f, InputType::f16), "K must be quantized as Q"));
  mixed = nvfp4;
  mixed.v = mxfp4.v;
  CHECK(mentions(sm120.supports(mixed, GpuArch::sm120f, InputType::f16), "V must be quantized"));

  AttentionVariant variant = nvfp4;
  variant.head_dim = 96;
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "head_dim 96"));
  variant = nvfp4;
  variant.block_kv = 32;
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "block_kv 32"));
  variant = nvfp4;
  variant.mask.kind = MaskKind::block_sparse;
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "block-sparse"));
  variant = nvfp4;
  variant.accumulation = {AccumulationKind::f32_two_level, 4};
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "accumulation must be f32"));
  variant = nvfp4;
  variant.smooth_v = SmoothScope::sequence;
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "smoothed V"));
  variant = nvfp4;
  variant.exp2_softmax = false;
  CHECK(mentions(sm120.supports(variant, GpuArch::sm120f, InputType::f16), "base 2"));
  CHECK_THROWS_AS(sm120.plan(int8, GpuArch::sm120f, InputType::f16), std::invalid_argument);
  CHECK_THROWS_AS(sm120.tunableSpace(nvfp4, GpuArch::sm100f, InputType::f16), std::invalid_argument);
}

TEST_CASE("sm120 plans: block-scaled m16n8k64 for both matmuls, the FP4 fields and the shared-memory layout") {
  const Sm120Schedule sm120;
  SUBCASE("sage3-fp4 d128: NVFP4, two-level P, delta_s, 4 warps, 3 stages") {
    const AttentionVariant variant = test::presetVariant("sage3-fp4", 128, MaskKind::causal);
    const KernelPlan plan = sm120.plan(variant, GpuArch::sm120f, InputType::f16);
    CHECK(plan.schedule == Sm120Schedule::kName);
    CHECK(plan.tunables == Tunables{64, variant.block_kv, 4, 3});
    CHECK(plan.threads == 128);
    CHECK(plan.qk_mma == MmaShape{16, 8, 64, ElementType::e2m1, ElementType::e2m1, AccumulatorType::f32});
    CHECK(plan.pv_mma == plan.qk_mma);
    CHECK(plan.pv_path == PvPath::e2m1_block_scaled);
    CHECK(plan.v_source == ValueSource::workspace_codes);
    CHECK(plan.fp4_scale_group == 16);
    CHECK(plan.fp4_two_level_p);
    CHECK(plan.fp4_delta_s);
    CHECK(plan.k_codes_token_order == KCodesTokenOrder::natural);
    CHECK(plan.fp4_permute_k_rows_in_shared);
    CHECK(plan.grid.reverse_q_blocks);
    // Code rows of d/2 bytes padded by 16; scale rows of d/16 bytes; V^T rows of block_kv/2 (+16) and block_kv/16.
    const int code_row = 128 / 2 + 16, v_row = variant.block_kv / 2 + 16;
    CHECK(plan.shared.q.bytes == 64 * code_row);
    CHECK(plan.shared.stage_offset == 64 * code_row + 64 * (128 / 16));
    CHECK(plan.shared.k.bytes == variant.block_kv * code_row);
    CHECK(plan.shared.k_scales.bytes == variant.block_kv * (128 / 16));
    CHECK(plan.shared.v.bytes == 128 * v_row);
    // ... and the block's delta_s row (f32 per token), Q being smoothed.
    CHECK(plan.shared.stage_bytes == variant.block_kv * code_row + variant.block_kv * 8 + 128 * v_row +
                                         128 * (variant.block_kv / 16) + variant.block_kv * 4);
    CHECK(plan.shared.total_bytes == plan.shared.stage_offset + 3 * plan.shared.stage_bytes);
  }
  SUBCASE("sage3-mxfp4 d64: 32-element UE8M0 groups, P microscaled directly") {
    const KernelPlan plan = sm120.plan(test::presetVariant("sage3-mxfp4", 64), GpuArch::sm120f, InputType::bf16);
    CHECK(plan.fp4_scale_group == 32);
    CHECK_FALSE(plan.fp4_two_level_p);
    CHECK(plan.shared.k_scales.bytes == plan.tunables.block_kv * (64 / 32));
    CHECK_FALSE(plan.grid.reverse_q_blocks);
  }
  SUBCASE("sage3-fp4-direct-p: no first-level scale") {
    CHECK_FALSE(
        sm120.plan(test::presetVariant("sage3-fp4-direct-p", 128), GpuArch::sm120f, InputType::f16).fp4_two_level_p);
  }
}

TEST_CASE("sm120 tunables: warps of 16 rows, the variant's block_kv, 2..4 stages; the space holds the defaults") {
  const Sm120Schedule sm120;
  const AttentionVariant variant = test::presetVariant("sage3-fp4", 128);
  auto reason = [&](Tunables tunables) {
    try {
      sm120.plan(variant, GpuArch::sm120f, InputType::f16, tunables);
    } catch (const std::invalid_argument &error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(reason({192, variant.block_kv, 12, 3}).find("tunables.warps") != std::string::npos);
  CHECK(reason({128, variant.block_kv, 4, 3}).find("tunables.block_q") != std::string::npos);
  CHECK(reason({64, 2 * variant.block_kv, 4, 3}).find("tunables.block_kv") != std::string::npos);
  CHECK(reason({64, variant.block_kv, 4, 5}).find("tunables.stages") != std::string::npos);
  CHECK(reason({128, variant.block_kv, 8, 4}).empty());

  const TunableSpace space = sm120.tunableSpace(variant, GpuArch::sm120f, InputType::f16);
  CHECK(space.schedule == Sm120Schedule::kName);
  CHECK(space.candidates.size() == 2 * 3);
  bool defaults_listed = false;
  for (const TunableCandidate &candidate : space.candidates) {
    CHECK(candidate.verdict.supported); // d128 with 4 stages fits sm_120's 99 KiB
    defaults_listed = defaults_listed || candidate.tunables == space.defaults;
  }
  CHECK(defaults_listed);
  CHECK(tunableSpace(variant, GpuArch::sm120f, InputType::f16).schedule == Sm120Schedule::kName);
}
