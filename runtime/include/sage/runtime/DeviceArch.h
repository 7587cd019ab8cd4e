// The architecture sagegen generates code for on the current CUDA device (device 0's primary context when no
// context is current).
#pragma once

#include "sage/schedules/GpuArch.h"

namespace sage::runtime {

// Throws CudaError when there is no driver or device, std::invalid_argument for a device sagegen does not target.
schedules::GpuArch currentDeviceArch();

} // namespace sage::runtime
