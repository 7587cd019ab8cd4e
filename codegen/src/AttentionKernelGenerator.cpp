#include "sage/codegen/AttentionKernelGenerator.h"

#include "KernelText.h"
#include "sage/codegen/KernelAbiSource.h"
#include "sage/schedules/Sm80Schedule.h"

#include <cctype>
#include <stdexcept>

namespace sage::codegen {
namespace {

// Letters and digits kept, everything else becomes '_', runs collapsed.
std::string identifierPart(std::string_view text) {
  std::string part;
  for (char c : text) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) != 0;
    if (keep)
      part += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!part.empty() && part.back() != '_')
      part += '_';
  }
  while (!part.empty() && part.back() == '_')
    part.pop_back();
  return part.empty() ? "variant" : part;
}

void validate(const AttentionVariant &variant, const schedules::KernelPlan &plan) {
  if (plan.schedule != schedules::Sm80Schedule::kName)
    throw std::invalid_argument("plan.schedule: the attention kernel generator writes '" +
                                std::string(schedules::Sm80Schedule::kName) + "' kernels, got '" + plan.schedule + "'");
  if (plan.head_dim != variant.head_dim)
    throw std::invalid_argument("plan.head_dim " + std::to_string(plan.head_dim) + " does not match the variant's " +
                                std::to_string(variant.head_dim) + ": make the plan from this variant");
  if (plan.threads != plan.tunables.warps * 32 || plan.shared.total_bytes <= 0)
    throw std::invalid_argument("plan: incomplete (make it with Sm80Schedule::plan)");
}

} // namespace

std::string AttentionKernelGenerator::kernelName(const AttentionVariant &variant, const schedules::KernelPlan &plan) {
  std::string name = "sage_attention_" + identifierPart(variant.name) + "_d" + std::to_string(plan.head_dim);
  if (variant.mask.kind == MaskKind::causal)
    name += "_causal";
  else if (variant.mask.kind == MaskKind::block_sparse)
    name += "_block_sparse";
  name += "_" + std::string(schedules::nameOf(plan.input));
  name += "_" + identifierPart(schedules::archName(plan.arch));
  return name;
}

KernelSource AttentionKernelGenerator::generate(const AttentionVariant &variant, const schedules::KernelPlan &plan) {
  validate(variant, plan);
  const detail::KernelContext context = detail::makeContext(variant, plan, kernelName(variant, plan));
  KernelSource kernel;
  kernel.name = context.name;
  kernel.entry_point = context.name;
  kernel.block_dim = {plan.threads, 1, 1};
  kernel.grid = plan.grid;
  kernel.grid_description = plan.grid.description();
  kernel.dynamic_shared_bytes = plan.shared.total_bytes;
  kernel.arch = plan.arch;

  std::string &source = kernel.source;
  source += detail::emitHeaderComment(context);
  source += "// ---- Kernel ABI (sage/codegen/KernelAbi.h) ----\n";
  source += kernelAbiSource();
  source += "\n\n";
  source += detail::emitConstants(context);
  source += detail::emitInstructionWrappers(context);
  source += detail::emitTileHelpers(context);
  source += detail::emitScoreSteps(context);
  source += detail::emitSoftmaxSteps(context);
  source += detail::emitValueSteps(context);
  source += detail::emitEpilogueSteps(context);
  source += detail::emitKernelEntry(context);
  return kernel;
}

KernelSource AttentionKernelGenerator::generate(const AttentionVariant &variant, const schedules::KernelPlan &plan,
                                                schedules::InputType input) {
  if (input != plan.input)
    throw std::invalid_argument("input: the plan was made for " + std::string(schedules::nameOf(plan.input)) +
                                " inputs, got " + std::string(schedules::nameOf(input)));
  return generate(variant, plan);
}

} // namespace sage::codegen
