#include "sage/runtime/AttentionKernelKeys.h"

#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"
#include "sage/schedules/Tunables.h"

#include <fmt/format.h>

namespace sage::runtime {

KernelKey attentionKernelKey(const std::string &ir_fingerprint, const AttentionVariant &variant,
                             const schedules::KernelPlan &plan, schedules::InputType input, schedules::GpuArch arch,
                             std::string_view entry_point, std::string_view source) {
  KernelKey key;
  key.ir_hash = ir_fingerprint;
  key.schedule = plan.schedule;
  key.tunables = schedules::tunablesText(plan.tunables);
  key.head_dim = variant.head_dim;
  key.causal = variant.mask.kind == MaskKind::causal;
  key.dtypes = fmt::format("qkv={},o={}", schedules::nameOf(input), schedules::nameOf(input));
  key.layout = "strided"; // HND and NHD are launch-time strides, not compile-time choices
  key.arch = std::string(schedules::archName(arch));
  key.compiler_version = nvrtcVersion();
  key.sagegen_version = sagegenVersion();
  // The source's own hash makes the key exact even for variants built without an IR fingerprint.
  key.extra = fmt::format("{};source-sha256={}", entry_point, sha256Hex(source));
  return key;
}

} // namespace sage::runtime
