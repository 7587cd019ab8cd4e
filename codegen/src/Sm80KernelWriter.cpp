#include "Sm80KernelWriter.h"

#include "KernelText.h"
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/KernelAbiSource.h"
#include "sage/schedules/Sm80Schedule.h"

#include <stdexcept>

namespace sage::codegen {

std::string_view Sm80KernelWriter::schedule() const { return schedules::Sm80Schedule::kName; }

KernelSource Sm80KernelWriter::write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const {
  if (plan.threads != plan.tunables.warps * 32 || plan.shared.total_bytes <= 0)
    throw std::invalid_argument("plan: incomplete (make it with Sm80Schedule::plan)");
  const detail::KernelContext context =
      detail::makeContext(variant, plan, AttentionKernelGenerator::kernelName(variant, plan));
  KernelSource kernel;
  kernel.name = context.name;
  kernel.entry_point = context.name;
  kernel.block_dim = {plan.threads, 1, 1};
  kernel.grid = plan.grid;
  kernel.grid_description = plan.grid.description();
  kernel.dynamic_shared_bytes = plan.shared.total_bytes;
  kernel.arch = plan.arch;
  kernel.uses_device_library = true; // the steps of sage/device/sm80/*.cuh

  std::string &source = kernel.source;
  source += detail::emitHeaderComment(context);
  source += "// ---- Kernel ABI (sage/codegen/KernelAbi.h) ----\n";
  source += kernelAbiSource();
  source += "\n\n";
  source += detail::emitConstants(context);
  source += detail::emitInstructionWrappers(context);
  source += detail::emitTileHelpers(context);
  if (context.fp4)
    source += detail::emitFp4DecodeSteps(context);
  source += detail::emitScoreSteps(context);
  source += detail::emitSoftmaxSteps(context);
  source += detail::emitValueSteps(context);
  source += detail::emitEpilogueSteps(context);
  source += detail::emitKernelEntry(context);
  return kernel;
}

} // namespace sage::codegen
