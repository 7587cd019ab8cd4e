#include "sage/schedules/ScheduleRegistry.h"

#include "sage/schedules/Sm120Schedule.h"
#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/Sm90Schedule.h"
#include "sage/schedules/UnsupportedError.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::schedules {

const std::vector<const Schedule *> &allSchedules() {
  // The one list: a new schedule is one line here.
  static const Sm80Schedule sm80 = Sm80Schedule::full();
  static const Sm90Schedule sm90;
  static const Sm120Schedule sm120;
  static const std::vector<const Schedule *> schedules{&sm80, &sm90, &sm120};
  return schedules;
}

const Schedule *findSchedule(std::string_view name) {
  for (const Schedule *schedule : allSchedules())
    if (schedule->name() == name)
      return schedule;
  return nullptr;
}

std::vector<const Schedule *> rankSchedules(std::span<const Schedule *const> schedules, GpuArch arch) {
  std::vector<const Schedule *> ranked(schedules.begin(), schedules.end());
  std::stable_sort(ranked.begin(), ranked.end(),
                   [arch](const Schedule *a, const Schedule *b) { return a->preference(arch) > b->preference(arch); });
  return ranked;
}

std::vector<ScheduleVerdict> scheduleVerdicts(std::span<const Schedule *const> schedules,
                                              const AttentionVariant &variant, GpuArch arch, InputType input) {
  std::vector<ScheduleVerdict> verdicts;
  for (const Schedule *schedule : rankSchedules(schedules, arch))
    verdicts.push_back({schedule->name(), schedule->supports(variant, arch, input)});
  return verdicts;
}

std::vector<ScheduleVerdict> scheduleVerdicts(const AttentionVariant &variant, GpuArch arch, InputType input) {
  return scheduleVerdicts(allSchedules(), variant, arch, input);
}

const Schedule &bestSchedule(std::span<const Schedule *const> schedules, const AttentionVariant &variant, GpuArch arch,
                             InputType input) {
  std::string reasons;
  for (const Schedule *schedule : rankSchedules(schedules, arch)) {
    SupportResult support = schedule->supports(variant, arch, input);
    if (support)
      return *schedule;
    reasons += "; " + std::string(schedule->name()) + ": " + support.reason;
  }
  throw UnsupportedError("variant '" + variant.name + "': no schedule supports it on " + std::string(archName(arch)) +
                         reasons);
}

const Schedule &bestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input) {
  return bestSchedule(allSchedules(), variant, arch, input);
}

KernelPlan planBestSchedule(const AttentionVariant &variant, GpuArch arch, InputType input,
                            std::optional<Tunables> tunables) {
  return bestSchedule(variant, arch, input).plan(variant, arch, input, tunables);
}

Tunables scheduledDefaultTunables(const AttentionVariant &variant, GpuArch arch, InputType input) {
  return planBestSchedule(variant, arch, input).tunables;
}

} // namespace sage::schedules
