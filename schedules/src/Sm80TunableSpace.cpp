// The sm80 schedule's sweep. A candidate's verdict is plan()'s own: plan() with explicit tunables checks
// divisibility, rows per warp (the register budget of S and O fragments) and shared memory, so the space never
// duplicates those rules.
#include "sage/schedules/Sm80Schedule.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace sage::schedules {

// Every power-of-two tile from one m16 row tile per warp up to twice the variant's tiles, 4/8/16 warps and 2..6
// pipeline stages. Tiles the workspace padding cannot use are kept so the table says why they are refused.
TunableSpace Sm80Schedule::tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  TunableSpace space;
  space.schedule = std::string(kName);
  space.defaults = plan(variant, arch, input).tunables; // throws with supports()' reason
  std::vector<int> block_qs, block_kvs;
  for (int block_q = 16; block_q <= std::max(256, variant.block_q); block_q *= 2)
    block_qs.push_back(block_q);
  for (int block_kv = 32; block_kv <= std::max(128, variant.block_kv); block_kv *= 2)
    block_kvs.push_back(block_kv);
  for (int warps : {4, 8, 16})
    for (int block_q : block_qs)
      for (int block_kv : block_kvs)
        for (int stages = 2; stages <= 6; ++stages) {
          const Tunables tunables{block_q, block_kv, warps, stages};
          SupportResult verdict = SupportResult::yes();
          try {
            plan(variant, arch, input, tunables);
          } catch (const std::invalid_argument &error) {
            verdict = SupportResult::no(error.what());
          }
          space.candidates.push_back({tunables, std::move(verdict)});
        }
  return space;
}

} // namespace sage::schedules
