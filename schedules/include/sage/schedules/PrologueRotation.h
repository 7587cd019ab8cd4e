// Which rotated variants (issue 28: Q and K rotated by a randomized Hadamard transform before psi) the quantization
// prologue can produce codes for. Every forward schedule reads Q's and K's codes from the prologue, so each refuses in
// `supports` what the prologue cannot rotate, and the prologue's generator refuses the same (one rule, here).
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/Support.h"

namespace sage::schedules {

// yes() for a variant without rotation.
SupportResult prologueRotationSupport(const AttentionVariant &variant);

} // namespace sage::schedules
