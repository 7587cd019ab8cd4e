#include "sage/schedules/PackedSequences.h"

#include <string>

namespace sage::schedules {

SupportResult packedSequencesSupport(const AttentionVariant &variant) {
  if (!variant.packed_sequences)
    return SupportResult::yes();
  if (const std::string problem = packedSequencesProblem(variant.mask.kind, variant.sla.enabled); !problem.empty())
    return SupportResult::no(problem);
  for (const QuantizerSpec *spec : {&variant.q, &variant.k, &variant.p, &variant.v})
    if (spec->dtype == ElementType::e2m1)
      return SupportResult::no("packed sequences: not built for FP4 (e2m1) operands yet (neither their emulation on "
                               "mma.sync nor the FP4 prologue reads sequence offsets)");
  return SupportResult::yes();
}

} // namespace sage::schedules
