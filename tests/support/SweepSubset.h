// Which cases the NVRTC sweeps compile. In full (every preset x head dim x mask x input x arch) only when
// SAGEGEN_FULL_SWEEPS is set to something other than 0: `SAGEGEN_FULL_SWEEPS=1 bash tools/test`, before a release
// or after changing a generator. Otherwise (CI, a plain tools/test) a deterministic subset that still compiles every
// kernel family for every arch: of a family's combinations, every `stride`-th, starting at an offset that rotates
// with the family and the arch, so that each combination is compiled for some (family, arch) and each (family, arch)
// compiles ceil(combinations / stride) of them.
#pragma once

#include <cstdlib>
#include <string_view>

namespace sage::test {

inline bool fullSweeps() {
  const char *value = std::getenv("SAGEGEN_FULL_SWEEPS");
  return value != nullptr && *value != '\0' && std::string_view(value) != "0";
}

inline bool sweepIncludes(int family, int arch, int combination, int stride) {
  return fullSweeps() || (combination + family + arch) % stride == 0;
}

} // namespace sage::test
