#include "sage/schedules/GpuArch.h"

#include <array>
#include <stdexcept>
#include <string>
#include <utility>

namespace sage::schedules {
namespace {

constexpr std::array<std::pair<GpuArch, std::string_view>, 6> kArchNames{{{GpuArch::sm80, "sm_80"},
                                                                          {GpuArch::sm86, "sm_86"},
                                                                          {GpuArch::sm89, "sm_89"},
                                                                          {GpuArch::sm90a, "sm_90a"},
                                                                          {GpuArch::sm100f, "sm_100f"},
                                                                          {GpuArch::sm120f, "sm_120f"}}};

} // namespace

std::string_view archName(GpuArch arch) {
  for (const auto &[value, name] : kArchNames)
    if (value == arch)
      return name;
  return "sm_unknown";
}

std::optional<GpuArch> parseArch(std::string_view text) {
  if (text.starts_with("sm_"))
    text.remove_prefix(3);
  else if (text.starts_with("sm"))
    text.remove_prefix(2);
  for (const auto &[value, name] : kArchNames) {
    std::string_view digits_and_suffix = name.substr(3); // "90a", "100f"
    std::string_view digits = digits_and_suffix;
    if (digits.ends_with('a') || digits.ends_with('f'))
      digits.remove_suffix(1);
    // One target per arch family is generated, so "90" means sm_90a and "100" or "100a" (the names before family
    // targets) mean sm_100f.
    if (text == digits_and_suffix || text == digits ||
        (text.size() == digits.size() + 1 && text.starts_with(digits) && (text.back() == 'a' || text.back() == 'f')))
      return value;
  }
  return std::nullopt;
}

GpuArch archFromComputeCapability(int major, int minor) {
  if (major == 8 && minor == 0)
    return GpuArch::sm80;
  if (major == 8 && minor >= 6 && minor <= 8) // sm_86 code runs on 8.7 (Orin) and 8.8
    return GpuArch::sm86;
  if (major == 8 && minor == 9)
    return GpuArch::sm89;
  // An "a" image loads only on exactly its arch; a family ("f") image on every member of the family: sm_100f on
  // 10.0 (B200) and 10.3 (B300), sm_120f on 12.0 (RTX 50) and 12.1 (GB10). The kernels for these use no
  // instruction outside the family's common set.
  if (major == 9 && minor == 0)
    return GpuArch::sm90a;
  if (major == 10 && (minor == 0 || minor == 3))
    return GpuArch::sm100f;
  if (major == 12 && (minor == 0 || minor == 1))
    return GpuArch::sm120f;
  throw std::invalid_argument("compute capability: expected 8.0, 8.6-8.9, 9.0, 10.0, 10.3, 12.0 or 12.1, got " +
                              std::to_string(major) + "." + std::to_string(minor));
}

int computeCapability(GpuArch arch) {
  switch (arch) {
  case GpuArch::sm80:
    return 80;
  case GpuArch::sm86:
    return 86;
  case GpuArch::sm89:
    return 89;
  case GpuArch::sm90a:
    return 90;
  case GpuArch::sm100f:
    return 100;
  case GpuArch::sm120f:
    return 120;
  }
  return 0;
}

bool hasInt8MmaSync(GpuArch) { return true; }
bool hasFp8MmaSync(GpuArch arch) { return computeCapability(arch) >= 89; }
bool hasWgmma(GpuArch arch) { return arch == GpuArch::sm90a; }
// sm_120f only: ptxas 13.0 rejects the block-scaled mma.sync for sm_100a/f, whose FP4 tensor cores are reached through
// tcgen05, which no schedule lowers to yet; there FP4 runs by emulation like on Hopper.
bool hasFp4BlockScaledMma(GpuArch arch) { return arch == GpuArch::sm120f; }

} // namespace sage::schedules
