// The sweepable tunables of each schedule. A candidate's verdict is the schedule's own: plan() with explicit
// tunables checks divisibility, rows per warp (the register budget of S and O fragments) and shared memory, so the
// space never duplicates those rules.
#include "sage/schedules/TunableSpace.h"

#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm80Schedule.h"

#include <algorithm>
#include <stdexcept>

namespace sage::schedules {
namespace {

// sm80: every power-of-two tile from one m16 row tile per warp up to twice the variant's tiles, 4/8/16 warps and 2..6
// pipeline stages. Tiles the workspace padding cannot use are kept so the table says why they are refused.
std::vector<TunableCandidate> sm80Candidates(const AttentionVariant &variant, GpuArch arch, InputType input) {
  std::vector<int> block_qs, block_kvs;
  for (int block_q = 16; block_q <= std::max(256, variant.block_q); block_q *= 2)
    block_qs.push_back(block_q);
  for (int block_kv = 32; block_kv <= std::max(128, variant.block_kv); block_kv *= 2)
    block_kvs.push_back(block_kv);
  std::vector<TunableCandidate> candidates;
  for (int warps : {4, 8, 16})
    for (int block_q : block_qs)
      for (int block_kv : block_kvs)
        for (int stages = 2; stages <= 6; ++stages) {
          const Tunables tunables{block_q, block_kv, warps, stages};
          SupportResult verdict = SupportResult::yes();
          try {
            Sm80Schedule::plan(variant, arch, input, tunables);
          } catch (const std::invalid_argument &error) {
            verdict = SupportResult::no(error.what());
          }
          candidates.push_back({tunables, std::move(verdict)});
        }
  return candidates;
}

} // namespace

TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) {
  TunableSpace space;
  const KernelPlan default_plan = planBestSchedule(variant, arch, input); // throws with every schedule's reason
  space.schedule = default_plan.schedule;
  space.defaults = default_plan.tunables;
  if (space.schedule == Sm80Schedule::kName)
    space.candidates = sm80Candidates(variant, arch, input);
  const bool listed = std::any_of(space.candidates.begin(), space.candidates.end(),
                                  [&](const TunableCandidate &c) { return c.tunables == space.defaults; });
  if (!listed) // a schedule whose defaults lie outside its sweep still measures them
    space.candidates.insert(space.candidates.begin(), {space.defaults, SupportResult::yes()});
  return space;
}

} // namespace sage::schedules
