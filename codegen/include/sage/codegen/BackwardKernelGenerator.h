// The kernels of a backward plan (SageBwd, issue 12): CUDA C++ that instantiates the device library's backward
// kernels (sage/device/sm80/backward.cuh) with the plan's constants. One writer per backward schedule, dispatched on
// plan.schedule (an unknown schedule is an error naming it).
#pragma once

#include "sage/ir/BackwardVariant.h"
#include "sage/schedules/BackwardSchedule.h"

#include <string>

namespace sage::codegen {

struct BackwardKernelSource {
  std::string name;   // identifies the kernels (also a file stem)
  std::string source; // one translation unit: the four extern "C" entry points of plan.launches
  schedules::BackwardKernelPlan plan;
  // Includes the device library's headers: NVRTC must receive them (DeviceLibrary.h).
  bool uses_device_library = true;
};

class BackwardKernelGenerator {
public:
  // Throws std::invalid_argument when the plan is not this variant's (head dim, mask) or names an unknown schedule.
  static BackwardKernelSource generate(const BackwardVariant &variant, const schedules::BackwardKernelPlan &plan);
  // "sagebwd_d128_causal_f16_sm_80_mma_sync_backward"
  static std::string kernelName(const BackwardVariant &variant, const schedules::BackwardKernelPlan &plan);
};

} // namespace sage::codegen
