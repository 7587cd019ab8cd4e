// Which packed variants (issue 28: variable-length sequences packed along the tokens, AttentionVariant::
// packed_sequences) the forward kernels run. The sm80 and sm90 schedules ask it in `supports` (the sm120 FP4 schedule
// refuses packed variants whole), so `sagegen explain` and the runtime's SAGE_UNSUPPORTED give its reason.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/Support.h"

namespace sage::schedules {

// yes() for a dense variant. A packed one: not SLA, not block_sparse (the IR's rule, packedSequencesProblem), and no
// FP4 (e2m1) operand: the FP4 kernels and their prologue are not built for packed batches.
SupportResult packedSequencesSupport(const AttentionVariant &variant);

} // namespace sage::schedules
