// The GPU architectures sagegen generates code for, and what each one's tensor cores can do.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sage::schedules {

enum class GpuArch { sm80, sm86, sm89, sm90a, sm100a, sm120a };

// "sm_80", "sm_90a", ... as NVRTC's --gpu-architecture expects.
std::string_view archName(GpuArch arch);
std::optional<GpuArch> parseArch(std::string_view text); // accepts "sm_90a", "sm90a", "90a"
GpuArch archFromComputeCapability(int major, int minor); // 9.0 -> sm90a, 8.9 -> sm89, 12.0 -> sm120a
int computeCapability(GpuArch arch);                     // sm_89 -> 89

bool hasInt8MmaSync(GpuArch arch);       // mma.sync m16n8k32 s8/u8 (all of ours)
bool hasFp8MmaSync(GpuArch arch);        // mma.sync m16n8k32 e4m3/e5m2: sm_89 and newer
bool hasWgmma(GpuArch arch);             // sm_90a only
bool hasFp4BlockScaledMma(GpuArch arch); // sm_100a, sm_120a

} // namespace sage::schedules
