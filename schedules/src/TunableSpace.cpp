// The sweep of the best schedule: each schedule lists its own candidates (Schedule::tunableSpace); this only
// guarantees that the defaults are measured too.
#include "sage/schedules/TunableSpace.h"

#include "sage/schedules/ScheduleRegistry.h"

#include <algorithm>

namespace sage::schedules {

TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) {
  TunableSpace space = bestSchedule(variant, arch, input).tunableSpace(variant, arch, input);
  const bool listed = std::any_of(space.candidates.begin(), space.candidates.end(),
                                  [&](const TunableCandidate &c) { return c.tunables == space.defaults; });
  if (!listed) // a schedule whose defaults lie outside its sweep still measures them
    space.candidates.insert(space.candidates.begin(), {space.defaults, SupportResult::yes()});
  return space;
}

} // namespace sage::schedules
