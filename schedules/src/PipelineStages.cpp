#include "PipelineStages.h"

#include "sage/schedules/GpuLimits.h"

#include <stdexcept>
#include <string>

namespace sage::schedules::detail {

SharedMemoryLayout fitPipelineStages(const std::function<SharedMemoryLayout(int stages)> &layout, int &stages,
                                     int min_stages, bool explicit_tunables, GpuArch arch) {
  const int limit = gpuLimits(arch).max_dynamic_shared_bytes_per_block;
  SharedMemoryLayout shared = layout(stages);
  while (!explicit_tunables && stages > min_stages && shared.total_bytes > limit)
    shared = layout(--stages);
  if (shared.total_bytes > limit)
    throw std::invalid_argument("tunables.stages: " + std::to_string(stages) + " stages need " +
                                std::to_string(shared.total_bytes) + " bytes of shared memory; " +
                                std::string(archName(arch)) + " allows " + std::to_string(limit) + " per block");
  return shared;
}

} // namespace sage::schedules::detail
