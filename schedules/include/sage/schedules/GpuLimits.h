// Per-architecture resource limits a schedule sizes its tiles against (CUDA programming guide, "Technical
// Specifications per Compute Capability").
#pragma once

#include "sage/schedules/GpuArch.h"

namespace sage::schedules {

struct GpuLimits {
  int shared_bytes_per_multiprocessor = 0;
  int max_dynamic_shared_bytes_per_block = 0; // with the opt-in attribute
  int reserved_shared_bytes_per_block = 0;    // taken by the system from every resident block
  int registers_per_multiprocessor = 0;
  int max_registers_per_thread = 0;
  int max_threads_per_multiprocessor = 0;
};

GpuLimits gpuLimits(GpuArch arch);

} // namespace sage::schedules
