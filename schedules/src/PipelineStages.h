// How deep a schedule's cp.async/TMA pipeline can be on an arch: shared by the schedules' plan() (internal header).
#pragma once

#include "sage/schedules/GpuArch.h"
#include "sage/schedules/KernelPlan.h"

#include <functional>

namespace sage::schedules::detail {

// The shared-memory layout of the deepest pipeline that fits. Default tunables give up stages (down to min_stages)
// before they give up fitting the arch; explicit tunables keep theirs. Either way a layout larger than the arch
// allows per block is refused (std::invalid_argument naming tunables.stages). `stages` is updated to the depth used.
SharedMemoryLayout fitPipelineStages(const std::function<SharedMemoryLayout(int stages)> &layout, int &stages,
                                     int min_stages, bool explicit_tunables, GpuArch arch);

} // namespace sage::schedules::detail
