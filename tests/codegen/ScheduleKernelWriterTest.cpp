// Codegen's dispatch: one writer per schedule, generate() goes through the writer of plan.schedule, an unknown
// schedule is refused by name.
#include "sage/codegen/ScheduleKernelWriter.h"

#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm80Schedule.h"

#include "TestVariants.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

TEST_CASE("every schedule has exactly one kernel writer") {
  for (const Schedule *schedule : allSchedules()) {
    const ScheduleKernelWriter *writer = findKernelWriter(schedule->name());
    REQUIRE_MESSAGE(writer != nullptr, schedule->name());
    CHECK(writer->schedule() == schedule->name());
  }
  for (const ScheduleKernelWriter *writer : allKernelWriters()) {
    CHECK(findSchedule(writer->schedule()) != nullptr);
    CHECK(findKernelWriter(writer->schedule()) == writer);
  }
  CHECK(findKernelWriter("sm90.wgmma.unknown") == nullptr);
}

TEST_CASE("generate writes with the writer of the plan's schedule") {
  for (const char *preset : {"sage-b", "sage2-fp8", "exact"}) {
    const AttentionVariant variant = test::presetVariant(preset, 64, MaskKind::causal);
    const KernelPlan plan = planBestSchedule(variant, GpuArch::sm89, InputType::f16);
    const KernelSource generated = AttentionKernelGenerator::generate(variant, plan);
    const KernelSource written = findKernelWriter(plan.schedule)->write(variant, plan);
    CHECK(generated.name == written.name);
    CHECK(generated.source == written.source);
    CHECK(generated.dynamic_shared_bytes == plan.shared.total_bytes);
  }
}

TEST_CASE("a plan of a schedule without a writer is refused, naming plan.schedule") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16);
  plan.schedule = "sm90.nonexistent";
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, plan),
                       doctest::Contains("plan.schedule: no kernel writer for schedule 'sm90.nonexistent' (writers "
                                         "exist for: sm80.mma_sync"),
                       std::invalid_argument);
  plan.schedule.clear();
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, plan), doctest::Contains("schedule ''"),
                       std::invalid_argument);
}

TEST_CASE("the sm80 writer refuses an incomplete plan") {
  const AttentionVariant variant = test::presetVariant("sage-b", 64);
  KernelPlan plan;
  plan.schedule = std::string(Sm80Schedule::kName);
  plan.head_dim = 64;
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, plan), doctest::Contains("plan: incomplete"),
                       std::invalid_argument);
}
