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

KernelKey backwardKernelKey(const std::string &ir_fingerprint, const schedules::BackwardKernelPlan &plan,
                            std::string_view module_name, std::string_view source) {
  KernelKey key;
  key.ir_hash = ir_fingerprint;
  key.schedule = plan.schedule;
  key.tunables = fmt::format("block_q={},block_kv={},warps={}", plan.block_q, plan.block_kv, plan.warps);
  key.head_dim = plan.head_dim;
  key.causal = plan.causal;
  const std::string_view input = schedules::nameOf(plan.input);
  key.dtypes = fmt::format("qkv={},do={},grads={}", input, input, input);
  key.layout = "contiguous";
  key.arch = std::string(schedules::archName(plan.arch));
  key.compiler_version = nvrtcVersion();
  key.sagegen_version = sagegenVersion();
  key.extra = fmt::format("{};source-sha256={}", module_name, sha256Hex(source));
  return key;
}

KernelKey slaKernelKey(const std::string &ir_fingerprint, const AttentionVariant &variant, schedules::GpuArch arch,
                       std::string_view module_name, std::string_view source, schedules::InputType input) {
  KernelKey key;
  key.ir_hash = ir_fingerprint;
  key.schedule = "sla"; // one fixed set of kernels, not a schedule's plan
  key.tunables = fmt::format("block_q={},block_kv={}", variant.block_q, variant.block_kv);
  key.head_dim = variant.head_dim;
  key.causal = false; // SLA variants take no mask
  key.dtypes = fmt::format("qkv={0},o={0}", schedules::nameOf(input));
  key.layout = "strided";
  key.arch = std::string(schedules::archName(arch));
  key.compiler_version = nvrtcVersion();
  key.sagegen_version = sagegenVersion();
  // The feature map and the k_h / k_l percentages are compiled into the source (or passed at launch): its hash
  // keeps the key exact.
  key.extra = fmt::format("{};source-sha256={}", module_name, sha256Hex(source));
  return key;
}

KernelKey mergeKernelKey(schedules::GpuArch arch, std::string_view dtypes, std::string_view module_name,
                         std::string_view source) {
  KernelKey key;
  key.schedule = "merge"; // one kernel, not a schedule's plan
  key.dtypes = std::string(dtypes);
  key.layout = "strided";
  key.arch = std::string(schedules::archName(arch));
  key.compiler_version = nvrtcVersion();
  key.sagegen_version = sagegenVersion();
  key.extra = fmt::format("{};source-sha256={}", module_name, sha256Hex(source));
  return key;
}

} // namespace sage::runtime
