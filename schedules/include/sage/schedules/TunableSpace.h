// The tunables a schedule can sweep for one (variant, arch, input), each with the schedule's verdict. The space
// belongs to the schedule: sm80 varies warps, stages and the two tile sizes; a warp-specialised sm90 schedule would
// add its consumer warpgroups. `sagegen tune` measures the supported candidates and reports the others' reasons.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/Support.h"
#include "sage/schedules/Tunables.h"

#include <string>
#include <vector>

namespace sage::schedules {

struct TunableCandidate {
  Tunables tunables;
  SupportResult verdict; // unsupported: the schedule's reason (shared memory, registers, divisibility)
};

struct TunableSpace {
  std::string schedule;                     // the schedule the candidates are for, e.g. "sm80.mma_sync"
  Tunables defaults;                        // what the schedule plans without explicit tunables (always supported)
  std::vector<TunableCandidate> candidates; // every combination the schedule considers, defaults included
};

// The space of the best schedule that supports the variant. Throws std::invalid_argument (as planBestSchedule)
// when no schedule supports it.
TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input);

} // namespace sage::schedules
