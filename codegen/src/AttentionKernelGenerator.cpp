#include "sage/codegen/AttentionKernelGenerator.h"

#include "sage/codegen/ScheduleKernelWriter.h"
#include "sage/codegen/SourceText.h"

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

std::string knownWriters() {
  std::string names;
  for (const ScheduleKernelWriter *writer : allKernelWriters())
    names += (names.empty() ? "" : ", ") + std::string(writer->schedule());
  return names;
}

} // namespace

std::string AttentionKernelGenerator::kernelName(const AttentionVariant &variant, const schedules::KernelPlan &plan) {
  std::string name =
      "sage_attention_" + identifierPart(sourceSafe(variant.name)) + "_d" + std::to_string(plan.head_dim);
  if (variant.mask.kind == MaskKind::causal)
    name += "_causal";
  else if (variant.mask.kind == MaskKind::block_sparse)
    name += "_block_sparse";
  if (plan.packed_sequences) // beside the dense kernel of the same variant (one module may hold both)
    name += "_packed";
  name += "_" + std::string(schedules::nameOf(plan.input));
  name += "_" + identifierPart(schedules::archName(plan.arch));
  if (plan.warp_specialization.consumer_warpgroups > 0) // the sm90 kernel beside the sm80 one of the same arch
    name += "_wgmma";
  return name;
}

KernelSource AttentionKernelGenerator::generate(const AttentionVariant &variant, const schedules::KernelPlan &plan) {
  const ScheduleKernelWriter *writer = findKernelWriter(plan.schedule);
  if (writer == nullptr)
    throw std::invalid_argument("plan.schedule: no kernel writer for schedule '" + plan.schedule +
                                "' (writers exist for: " + knownWriters() + ")");
  if (plan.head_dim != variant.head_dim)
    throw std::invalid_argument("plan.head_dim " + std::to_string(plan.head_dim) + " does not match the variant's " +
                                std::to_string(variant.head_dim) + ": make the plan from this variant");
  return writer->write(variant, plan);
}

KernelSource AttentionKernelGenerator::generate(const AttentionVariant &variant, const schedules::KernelPlan &plan,
                                                schedules::InputType input) {
  if (input != plan.input)
    throw std::invalid_argument("input: the plan was made for " + std::string(schedules::nameOf(plan.input)) +
                                " inputs, got " + std::string(schedules::nameOf(input)));
  return generate(variant, plan);
}

} // namespace sage::codegen
