// One way of computing attention on a family of GPUs. A schedule decides whether it can run a variant, plans it
// (tiles, warps, pipeline, mma shapes, shared memory; see KernelPlan.h), lists the tunables it can sweep, and
// says how much it is preferred on each arch. The registry (ScheduleRegistry.h) ranks the schedules it lists and
// plans with the best one that supports the variant; codegen writes the kernel of a plan with the writer
// registered for plan.schedule.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/Support.h"
#include "sage/schedules/TunableSpace.h"
#include "sage/schedules/Tunables.h"

#include <optional>
#include <string_view>

namespace sage::schedules {

class Schedule {
public:
  virtual ~Schedule() = default;

  // "sm80.mma_sync": the value of KernelPlan::schedule in this schedule's plans.
  virtual std::string_view name() const = 0;
  // One line for `sagegen explain`: the instructions and the pipeline.
  virtual std::string_view summary() const = 0;
  // Higher is preferred on `arch`. Only the order among schedules matters; a schedule that does not exist on an
  // arch still ranks (its supports() says why it does not run there).
  virtual int preference(GpuArch arch) const = 0;

  // Whether this schedule can run `variant` on `arch` for inputs of `input` type; the reason when not.
  virtual SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType input) const = 0;

  // The plan for `variant`; without tunables, the schedule's defaults for the arch. Throws std::invalid_argument
  // when unsupported (with supports()' reason) or when the given tunables are invalid or do not fit (naming the
  // tunable).
  virtual KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                          std::optional<Tunables> tunables = std::nullopt) const = 0;

  // The tunables this schedule can sweep for the variant, each with its verdict; `defaults` is what plan() uses
  // without tunables. Throws std::invalid_argument when the variant is unsupported.
  virtual TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const = 0;

protected:
  // The start of plan(): throws std::invalid_argument with supports()' reason when the variant is unsupported.
  void requireSupported(const AttentionVariant &variant, GpuArch arch, InputType input) const;
  // A plan of this schedule for `variant` with the `chosen` tunables: its schedule, arch, input, tunables and head_dim.
  KernelPlan planOf(const AttentionVariant &variant, GpuArch arch, InputType input, const Tunables &chosen) const;
};

} // namespace sage::schedules
