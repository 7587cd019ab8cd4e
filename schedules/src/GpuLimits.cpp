#include "sage/schedules/GpuLimits.h"

namespace sage::schedules {

GpuLimits gpuLimits(GpuArch arch) {
  constexpr int kKiB = 1024;
  GpuLimits limits;
  limits.reserved_shared_bytes_per_block = 1 * kKiB;
  limits.registers_per_multiprocessor = 64 * kKiB;
  limits.max_registers_per_thread = 255;
  switch (arch) {
  case GpuArch::sm80:
    limits.shared_bytes_per_multiprocessor = 164 * kKiB;
    limits.max_dynamic_shared_bytes_per_block = 163 * kKiB;
    limits.max_threads_per_multiprocessor = 2048;
    break;
  case GpuArch::sm86:
  case GpuArch::sm89:
  case GpuArch::sm120f:
    limits.shared_bytes_per_multiprocessor = 100 * kKiB;
    limits.max_dynamic_shared_bytes_per_block = 99 * kKiB;
    limits.max_threads_per_multiprocessor = 1536;
    break;
  case GpuArch::sm90a:
  case GpuArch::sm100f:
    limits.shared_bytes_per_multiprocessor = 228 * kKiB;
    limits.max_dynamic_shared_bytes_per_block = 227 * kKiB;
    limits.max_threads_per_multiprocessor = 2048;
    break;
  }
  return limits;
}

} // namespace sage::schedules
