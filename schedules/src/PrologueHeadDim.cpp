#include "sage/schedules/PrologueHeadDim.h"

#include <string>

namespace sage::schedules {

SupportResult prologueHeadDimSupport(int head_dim) {
  // A token's row of d channels is d / 8 16-byte vectors on a power-of-two group of lanes within one warp
  // (sage/device/prologue/token_tile.cuh; lanes past d / 8 hold none): at most 32 lanes, i.e. d <= 256.
  if (head_dim < 16 || head_dim > 256 || head_dim % 16 != 0)
    return SupportResult::no("head_dim " + std::to_string(head_dim) +
                             ": the quantization prologue handles head_dim 16..256 in steps of 16 (a row is d / 8 "
                             "16-byte vectors on the lanes of one warp)");
  return SupportResult::yes();
}

} // namespace sage::schedules
