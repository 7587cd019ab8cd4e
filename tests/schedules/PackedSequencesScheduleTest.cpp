// The forward schedules' verdicts on packed variable-length batches (issue 28): sm80 and sm90 run what they run dense
// (masks none and causal, no FP4 operand) and plan it as dense with plan.packed_sequences set; FP4, block-sparse masks
// and SLA are refused with the reason; the sm120 FP4 schedule refuses packed variants whole.
#include "sage/schedules/PackedSequences.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm120Schedule.h"
#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/Sm90Schedule.h"

#include "../codegen/TestVariants.h"
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::schedules;

namespace {

const GpuArch kArchs[] = {GpuArch::sm80,  GpuArch::sm86,   GpuArch::sm89,
                          GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f};

bool mentions(const SupportResult &verdict, const std::string &text) {
  return !verdict.supported && verdict.reason.find(text) != std::string::npos;
}

} // namespace

TEST_CASE("every preset with a kernel runs packed where it runs dense, planned as dense with packed_sequences set") {
  std::vector<std::string> names = test::presetNames();
  for (const dsl::PresetInfo &info : dsl::rotatedPresets())
    names.emplace_back(info.name);
  names.emplace_back("sage2-int4"); // int4 Q/K decoded to int8 on the sm80 schedule
  for (const std::string &name : names)
    for (MaskKind mask : {MaskKind::none, MaskKind::causal})
      for (GpuArch arch : kArchs) {
        CAPTURE(name);
        CAPTURE(archName(arch));
        CAPTURE(mask == MaskKind::causal);
        const AttentionVariant dense = test::presetVariant(name, 128, mask, true);
        const AttentionVariant packed = packedSequencesOf(dense);
        const std::vector<ScheduleVerdict> dense_verdicts = scheduleVerdicts(dense, arch, InputType::f16);
        const std::vector<ScheduleVerdict> packed_verdicts = scheduleVerdicts(packed, arch, InputType::f16);
        REQUIRE(dense_verdicts.size() == packed_verdicts.size());
        for (size_t i = 0; i < dense_verdicts.size(); ++i) {
          CAPTURE(dense_verdicts[i].schedule);
          CHECK(packed_verdicts[i].schedule == dense_verdicts[i].schedule);
          CHECK(packed_verdicts[i].support.supported == dense_verdicts[i].support.supported);
          CHECK(packed_verdicts[i].support.reason == dense_verdicts[i].support.reason);
        }
        bool runs = false;
        for (const ScheduleVerdict &verdict : dense_verdicts)
          runs = runs || verdict.support.supported;
        if (!runs)
          continue;
        const KernelPlan dense_plan = planBestSchedule(dense, arch, InputType::f16);
        const KernelPlan packed_plan = planBestSchedule(packed, arch, InputType::f16);
        CHECK(packed_plan.packed_sequences);
        CHECK_FALSE(dense_plan.packed_sequences);
        CHECK(packed_plan.schedule == dense_plan.schedule);
        CHECK(tunablesText(packed_plan.tunables) == tunablesText(dense_plan.tunables));
        CHECK(packed_plan.shared.total_bytes == dense_plan.shared.total_bytes);
      }
}

TEST_CASE("packed FP4 variants are refused by every schedule, with the reason") {
  const Sm80Schedule full = Sm80Schedule::full();
  const Sm120Schedule sm120;
  for (const char *name : {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4"}) {
    CAPTURE(std::string(name));
    const AttentionVariant dense = test::presetVariant(name, 128, MaskKind::causal);
    const AttentionVariant packed = packedSequencesOf(dense);
    // Dense, sm80 emulates FP4 on sm_90a and sm120 runs it natively on sm_120f; packed, neither does.
    REQUIRE(full.supports(dense, GpuArch::sm90a, InputType::f16));
    REQUIRE(sm120.supports(dense, GpuArch::sm120f, InputType::f16));
    CHECK(mentions(full.supports(packed, GpuArch::sm90a, InputType::f16),
                   "packed sequences: not built for FP4 (e2m1) operands yet"));
    CHECK(mentions(sm120.supports(packed, GpuArch::sm120f, InputType::bf16),
                   "packed sequences: not built for the FP4 kernel yet"));
    for (GpuArch arch : kArchs)
      for (const ScheduleVerdict &verdict : scheduleVerdicts(packed, arch, InputType::f16))
        CHECK_FALSE(verdict.support);
    CHECK_THROWS_WITH_AS(planBestSchedule(packed, GpuArch::sm120f, InputType::f16),
                         doctest::Contains("packed sequences: not built for the FP4 kernel yet"),
                         std::invalid_argument);
  }
}

TEST_CASE("packed block-sparse and SLA variants are refused by sm80 and sm90, with the IR's reason") {
  // The vocabulary's AttentionVariant can say what the IR would refuse; the schedules refuse it too.
  AttentionVariant block_sparse = test::presetVariant("sage-b", 128, MaskKind::block_sparse);
  REQUIRE(Sm90Schedule().supports(block_sparse, GpuArch::sm90a, InputType::f16));
  block_sparse.packed_sequences = true;
  AttentionVariant sla = dsl::preset("sla-int8", 64)->describe();
  sla.packed_sequences = true;
  for (const AttentionVariant &variant : {block_sparse, sla}) {
    CAPTURE(variant.name);
    const std::string expected = packedSequencesProblem(variant.mask.kind, variant.sla.enabled);
    REQUIRE_FALSE(expected.empty());
    CHECK(mentions(Sm90Schedule().supports(variant, GpuArch::sm90a, InputType::f16), expected));
    CHECK(mentions(Sm80Schedule::full().supports(variant, GpuArch::sm80, InputType::f16), expected));
    CHECK(mentions(packedSequencesSupport(variant), expected));
  }
  CHECK(packedSequencesSupport(test::presetVariant("sage-b", 128, MaskKind::block_sparse))); // dense: not its concern
}
