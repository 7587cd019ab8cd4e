// SLA variants (issue 13): no attention schedule runs the whole of one (it would drop the linear branch), and the
// sparse part of every SLA preset is an ordinary block-sparse variant that the sm80 schedule plans on sm_80 and sm_89
// and the sm90 schedule on sm_90a (the SLA runner's critical blocks run there), for f16 and bf16 inputs alike.
#include "sage/dsl/Presets.h"
#include "sage/schedules/ScheduleRegistry.h"

#include <doctest/doctest.h>

using namespace sage;
using namespace sage::schedules;

TEST_CASE("schedules refuse SLA variants and plan their sparse parts") {
  for (const dsl::PresetInfo &info : dsl::slaPresets())
    for (int head_dim : {64, 128})
      for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a})
        for (InputType input : {InputType::f16, InputType::bf16}) {
          CAPTURE(std::string(info.name));
          CAPTURE(head_dim);
          CAPTURE(std::string(archName(arch)));
          CAPTURE(std::string(nameOf(input)));
          const AttentionVariant variant = dsl::preset(info.name, head_dim)->describe();
          for (const ScheduleVerdict &verdict : scheduleVerdicts(variant, arch, input))
            CHECK_FALSE(verdict.support);
          AttentionVariant sparse = variant;
          sparse.sla = SlaSpec{};
          const Schedule &chosen = bestSchedule(sparse, arch, input);
          CHECK(chosen.name() == (arch == GpuArch::sm90a ? "sm90.wgmma_tma" : "sm80.mma_sync"));
          const KernelPlan plan = chosen.plan(sparse, arch, input);
          CHECK(plan.input == input);
          CHECK(plan.tunables.block_q == 64);
          CHECK(plan.tunables.block_kv == 64);
        }
}
