// The schedules sagegen knows, best first, and the choice among them for one (variant, arch, input).
// Today there is one (sm80.mma_sync, which also serves sm_86/sm_89/sm_90a); the sm90 wgmma and FP4 schedules
// join this list when they exist.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/Support.h"
#include "sage/schedules/Tunables.h"

#include <optional>
#include <string_view>
#include <vector>

namespace sage::schedules {

struct ScheduleVerdict {
  std::string_view schedule; // e.g. "sm80.mma_sync"
  SupportResult support;
};

// Every schedule's answer for this (variant, arch, input), in order of preference.
std::vector<ScheduleVerdict> scheduleVerdicts(const AttentionVariant &variant, GpuArch arch, InputType input);

// The plan of the most preferred schedule that supports the variant. Throws UnsupportedError listing each
// schedule's reason when none does.
KernelPlan planBestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input,
                            std::optional<Tunables> tunables = std::nullopt);

} // namespace sage::schedules
