#include "sage/schedules/PrologueRotation.h"

#include <string>

namespace sage::schedules {

SupportResult prologueRotationSupport(const AttentionVariant &variant) {
  if (!variant.q.rotation_seed && !variant.k.rotation_seed)
    return SupportResult::yes();
  if (variant.q.rotation_seed != variant.k.rotation_seed)
    return SupportResult::no("rotation: Q and K must be rotated with the same seed (the verifier's rule)");
  // The prologue's rotation is a butterfly over a token's d / 8 lanes of one warp (sage/device/prologue/rotation.cuh).
  if (variant.head_dim != 16 && variant.head_dim != 32 && variant.head_dim != 64 && variant.head_dim != 128 &&
      variant.head_dim != 256)
    return SupportResult::no("rotation: head_dim " + std::to_string(variant.head_dim) + " is not a power of two");
  for (const QuantizerSpec *spec : {&variant.q, &variant.k}) {
    const char *who = spec == &variant.q ? "Q" : "K";
    if (spec->granularity == Granularity::per_tensor)
      return SupportResult::no(std::string("rotation: a per-tensor ") + who +
                               " scale comes from launch 1's amax (for K: the column minima and maxima of the "
                               "unrotated K, which do not bound a rotated token); the prologue rotates Q and K with "
                               "per-token, per-block, per-warp or per-thread scales");
    if (isMicroscale(spec->granularity))
      return SupportResult::no(std::string("rotation: the prologue does not rotate microscaled (FP4) ") + who);
    if (!spec->quantized())
      return SupportResult::no(std::string("rotation: ") + who + " is not quantized");
  }
  return SupportResult::yes();
}

} // namespace sage::schedules
