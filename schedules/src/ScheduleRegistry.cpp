#include "sage/schedules/ScheduleRegistry.h"

#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/UnsupportedError.h"

#include <stdexcept>
#include <string>

namespace sage::schedules {

std::vector<ScheduleVerdict> scheduleVerdicts(const AttentionVariant &variant, GpuArch arch, InputType input) {
  return {{Sm80Schedule::kName, Sm80Schedule::supports(variant, arch, input)}};
}

KernelPlan planBestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input,
                            std::optional<Tunables> tunables) {
  std::string reasons;
  for (const ScheduleVerdict &verdict : scheduleVerdicts(variant, arch, input)) {
    if (verdict.support) {
      if (verdict.schedule == Sm80Schedule::kName)
        return Sm80Schedule::plan(variant, arch, input, tunables);
      continue;
    }
    reasons += "; " + std::string(verdict.schedule) + ": " + verdict.support.reason;
  }
  throw UnsupportedError("variant '" + variant.name + "': no schedule supports it on " + std::string(archName(arch)) +
                         reasons);
}

} // namespace sage::schedules
