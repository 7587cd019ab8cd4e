// Writes the attention kernel of one schedule's plans. AttentionKernelGenerator::generate dispatches on
// plan.schedule to the writer registered for it (one list, in KernelWriterRegistry.cpp), so a new schedule brings
// its writer and adds one line there.
#pragma once

#include "sage/codegen/KernelSource.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/KernelPlan.h"

#include <string_view>
#include <vector>

namespace sage::codegen {

class ScheduleKernelWriter {
public:
  virtual ~ScheduleKernelWriter() = default;

  // The schedule whose plans this writer reads (the plans' KernelPlan::schedule), e.g. "sm80.mma_sync".
  virtual std::string_view schedule() const = 0;

  // The kernel for `plan`, named AttentionKernelGenerator::kernelName(variant, plan). The caller has checked that
  // plan.schedule is schedule() and that the plan is this variant's (head dim). Throws std::invalid_argument for a
  // plan the writer cannot use (naming the field).
  virtual KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const = 0;
};

// Every writer, one per schedule.
const std::vector<const ScheduleKernelWriter *> &allKernelWriters();

// The writer for `schedule`, or nullptr.
const ScheduleKernelWriter *findKernelWriter(std::string_view schedule);

} // namespace sage::codegen
