#include "sage/runtime/AttentionKernelKeys.h"

#include "sage/runtime/NvrtcCompiler.h"
#include "sage/runtime/Sha256.h"
#include "sage/schedules/Tunables.h"

#include <fmt/format.h>

#include <utility>

namespace sage::runtime {

namespace {

// What every key shares: the arch, the compilers' versions, and the entry point or module with the source's own hash
// (which keeps a key exact even for variants built without an IR fingerprint).
KernelKey withBuild(KernelKey key, schedules::GpuArch arch, std::string_view name, std::string_view source) {
  key.arch = std::string(schedules::archName(arch));
  key.compiler_version = nvrtcVersion();
  key.sagegen_version = sagegenVersion();
  key.extra = fmt::format("{};source-sha256={}", name, sha256Hex(source));
  return key;
}

} // namespace

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
  return withBuild(std::move(key), arch, entry_point, source);
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
  return withBuild(std::move(key), plan.arch, module_name, source);
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
  // The feature map and the k_h / k_l percentages are compiled into the source (or passed at launch): its hash
  // keeps the key exact.
  return withBuild(std::move(key), arch, module_name, source);
}

KernelKey mergeKernelKey(schedules::GpuArch arch, std::string_view dtypes, std::string_view module_name,
                         std::string_view source) {
  KernelKey key;
  key.schedule = "merge"; // one kernel, not a schedule's plan
  key.dtypes = std::string(dtypes);
  key.layout = "strided";
  return withBuild(std::move(key), arch, module_name, source);
}

} // namespace sage::runtime
