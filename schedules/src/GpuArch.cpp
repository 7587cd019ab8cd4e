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
                                                                          {GpuArch::sm100a, "sm_100a"},
                                                                          {GpuArch::sm120a, "sm_120a"}}};

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
    std::string_view digits_and_suffix = name.substr(3); // "90a"
    std::string_view digits = digits_and_suffix;
    if (digits.ends_with('a'))
      digits.remove_suffix(1);
    // The arch-specific ("a") targets are the only ones we generate for, so "90" means sm_90a too.
    if (text == digits_and_suffix || text == digits)
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
  if (major == 9)
    return GpuArch::sm90a;
  if (major == 10)
    return GpuArch::sm100a;
  if (major == 12)
    return GpuArch::sm120a;
  throw std::invalid_argument("compute capability: expected 8.0, 8.6-8.9, 9.x, 10.x or 12.x, got " +
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
  case GpuArch::sm100a:
    return 100;
  case GpuArch::sm120a:
    return 120;
  }
  return 0;
}

bool hasInt8MmaSync(GpuArch) { return true; }
bool hasFp8MmaSync(GpuArch arch) { return computeCapability(arch) >= 89; }
bool hasWgmma(GpuArch arch) { return arch == GpuArch::sm90a; }
bool hasFp4BlockScaledMma(GpuArch arch) { return arch == GpuArch::sm100a || arch == GpuArch::sm120a; }

} // namespace sage::schedules
