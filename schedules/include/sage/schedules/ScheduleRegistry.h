// The schedules sagegen knows (one list, in ScheduleRegistry.cpp), ranked per arch, and the choice among them for
// one (variant, arch, input). Every function taking `schedules` has an overload over allSchedules(); the explicit
// list is for tests and tools that rank a subset.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/Schedule.h"
#include "sage/schedules/Support.h"
#include "sage/schedules/Tunables.h"

#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace sage::schedules {

// Every schedule, in registration order (the tie-break between equal preferences).
const std::vector<const Schedule *> &allSchedules();

// The schedule named `name` ("sm80.mma_sync"), or nullptr.
const Schedule *findSchedule(std::string_view name);

// `schedules` by decreasing preference(arch); equal preferences keep their order.
std::vector<const Schedule *> rankSchedules(std::span<const Schedule *const> schedules, GpuArch arch);

struct ScheduleVerdict {
  std::string_view schedule; // e.g. "sm80.mma_sync"
  SupportResult support;
};

// Every schedule's answer for this (variant, arch, input), in order of preference on `arch`.
std::vector<ScheduleVerdict> scheduleVerdicts(const AttentionVariant &variant, GpuArch arch, InputType input);
std::vector<ScheduleVerdict> scheduleVerdicts(std::span<const Schedule *const> schedules,
                                              const AttentionVariant &variant, GpuArch arch, InputType input);

// The most preferred schedule that supports the variant. Throws UnsupportedError (an std::invalid_argument) listing
// each schedule's reason ("variant 'x': no schedule supports it on sm_80; sm80.mma_sync: <reason>; ...") when none
// does.
const Schedule &bestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input);
const Schedule &bestSchedule(std::span<const Schedule *const> schedules, const AttentionVariant &variant, GpuArch arch,
                             InputType input);

// bestSchedule(...).plan(variant, arch, input, tunables), with bestSchedule's error when none supports it.
KernelPlan planBestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input,
                            std::optional<Tunables> tunables = std::nullopt);

// The tunables of the best schedule's default plan on `arch`: what a partial tunables text keeps for the fields it
// leaves out (each schedule has defaults of its own: sm90's count consumer warps, sm80's Table 12's warps).
Tunables scheduledDefaultTunables(const AttentionVariant &variant, GpuArch arch, InputType input);

} // namespace sage::schedules
