// Which head dims the quantization prologue (sage/device/prologue/) can quantize, convert and transpose. Every
// forward schedule reads Q's and K's codes from the prologue, so each refuses in `supports` what the prologue cannot
// produce, and the prologue's generator refuses the same (one rule, here).
#pragma once

#include "sage/schedules/Support.h"

namespace sage::schedules {

// yes() for a head dim the prologue handles; otherwise the reason, naming the head dim.
SupportResult prologueHeadDimSupport(int head_dim);

} // namespace sage::schedules
