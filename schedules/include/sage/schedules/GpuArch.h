// The GPU architectures sagegen generates code for, and what each one's tensor cores can do.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sage::schedules {

// One target per family: plain sm_80/86/89 images run on later minors of their major; sm_90a only on 9.0; the
// family targets sm_100f (10.0, 10.3) and sm_120f (12.0, 12.1) on every member of their family.
enum class GpuArch { sm80, sm86, sm89, sm90a, sm100f, sm120f };

// "sm_80", "sm_90a", ... as NVRTC's --gpu-architecture expects.
std::string_view archName(GpuArch arch);
std::optional<GpuArch> parseArch(std::string_view text); // "sm_90a", "sm90a", "90a", "90"; "sm_100a" = sm_100f
GpuArch archFromComputeCapability(int major, int minor); // 9.0 -> sm90a, 10.3 -> sm100f, 12.1 -> sm120f
int computeCapability(GpuArch arch);                     // sm_89 -> 89

bool hasInt8MmaSync(GpuArch arch);       // mma.sync m16n8k32 s8/u8 (all of ours)
bool hasFp8MmaSync(GpuArch arch);        // mma.sync m16n8k32 e4m3/e5m2: sm_89 and newer
bool hasWgmma(GpuArch arch);             // sm_90a only
bool hasFp4BlockScaledMma(GpuArch arch); // mma.sync kind::mxf4nvf4.block_scale: sm_120f only

} // namespace sage::schedules
