#include "sage/schedules/Schedule.h"

#include <stdexcept>
#include <string>

namespace sage::schedules {

void Schedule::requireSupported(const AttentionVariant &variant, GpuArch arch, InputType input) const {
  if (SupportResult support = supports(variant, arch, input); !support)
    throw std::invalid_argument("variant '" + variant.name + "' on " + std::string(archName(arch)) +
                                ": unsupported by " + std::string(name()) + ": " + support.reason);
}

KernelPlan Schedule::planOf(const AttentionVariant &variant, GpuArch arch, InputType input,
                            const Tunables &chosen) const {
  KernelPlan plan;
  plan.schedule = std::string(name());
  plan.arch = arch;
  plan.input = input;
  plan.tunables = chosen;
  plan.head_dim = variant.head_dim;
  plan.packed_sequences = variant.packed_sequences;
  return plan;
}

} // namespace sage::schedules
