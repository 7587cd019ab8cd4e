#include "sage/schedules/GpuLimits.h"

namespace sage::schedules {

GpuLimits gpuLimits(GpuArch arch) {
  constexpr int kKiB = 1024;
  GpuLimits limits;
  limits.reserved_shared_bytes_per_block = 1 * kKiB;
  limits.registers_per_multiprocessor = 64 * kKiB;
  limits.max_registers_per_thread = 255;
  // A block may take all of a multiprocessor's shared memory but the 1 KiB reserved per block.
  auto multiprocessor = [&](int shared_kib, int max_threads) {
    limits.shared_bytes_per_multiprocessor = shared_kib * kKiB;
    limits.max_dynamic_shared_bytes_per_block = (shared_kib - 1) * kKiB;
    limits.max_threads_per_multiprocessor = max_threads;
  };
  switch (arch) {
  case GpuArch::sm80:
    multiprocessor(164, 2048);
    break;
  case GpuArch::sm86:
  case GpuArch::sm89:
  case GpuArch::sm120f:
    multiprocessor(100, 1536);
    break;
  case GpuArch::sm90a:
  case GpuArch::sm100f:
    multiprocessor(228, 2048);
    break;
  }
  return limits;
}

} // namespace sage::schedules
