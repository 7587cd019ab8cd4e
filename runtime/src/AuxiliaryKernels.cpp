#include "sage/runtime/AuxiliaryKernels.h"

#include "sage/codegen/BackwardKernelGenerator.h"
#include "sage/codegen/SlaKernels.h"
#include "sage/runtime/AttentionKernelKeys.h"

namespace sage::runtime {

BackwardKernelSet generateBackwardKernels(const BackwardVariant &variant, schedules::InputType input,
                                          schedules::GpuArch arch, const std::string &ir_fingerprint) {
  BackwardKernelSet set;
  set.plan = schedules::bestBackwardSchedule(variant, arch, input).plan(variant, arch, input);
  codegen::BackwardKernelSource source = codegen::BackwardKernelGenerator::generate(variant, set.plan);
  GeneratedKernel &kernel = set.kernel;
  kernel.role = AttentionKernelRole::backward;
  kernel.name = source.name;
  kernel.entry_point = source.name;
  kernel.source = std::move(source.source);
  kernel.uses_device_library = source.uses_device_library;
  kernel.block = {static_cast<unsigned>(32 * set.plan.warps), 1, 1}; // the main kernel's (each launch has its own)
  kernel.grid_rule = set.plan.describe();
  // The key hashes the headers too: a changed device library is a different kernel.
  kernel.key = backwardKernelKey(ir_fingerprint, set.plan, kernel.name, selfContainedSource(kernel));
  return set;
}

GeneratedKernel generateSlaModule(const AttentionVariant &variant, schedules::GpuArch arch,
                                  const std::string &ir_fingerprint, schedules::InputType input) {
  codegen::SlaKernelSource source = codegen::generateSlaKernels(variant, input);
  GeneratedKernel kernel;
  kernel.role = AttentionKernelRole::sla;
  kernel.name = source.name;
  kernel.entry_point = source.name;
  kernel.source = std::move(source.source);
  kernel.uses_device_library = true; // it includes the device library's sla headers
  kernel.key = slaKernelKey(ir_fingerprint, variant, arch, kernel.name, selfContainedSource(kernel), input);
  return kernel;
}

} // namespace sage::runtime
