#include "sage/runtime/DeviceArch.h"

#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/CudaError.h"

namespace sage::runtime {

schedules::GpuArch currentDeviceArch() {
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.available())
    throw CudaError("cuInit", 0, "no CUDA driver or device: " + driver.status().reason);
  driver.ensureContext();
  const ComputeCapability capability = driver.computeCapability(driver.currentDevice());
  return schedules::archFromComputeCapability(capability.major, capability.minor);
}

} // namespace sage::runtime
