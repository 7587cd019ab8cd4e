// Writes the CUDA C++ of the attention main loop for one variant under one schedule plan, with the writer
// registered for plan.schedule (ScheduleKernelWriter.h). The text is meant to be read: named fragments, tunables
// as constexpr at the top, one comment per step of the paper's Algorithm 1.
#pragma once

#include "sage/codegen/KernelSource.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"

#include <string>

namespace sage::codegen {

class AttentionKernelGenerator {
public:
  // `plan` must come from a schedule's plan() for this variant (it carries the arch and the input type).
  // Throws std::invalid_argument when no writer is registered for plan.schedule (naming it) or the plan does not
  // match the variant (head dim).
  static KernelSource generate(const AttentionVariant &variant, const schedules::KernelPlan &plan);
  // The same, checking that `input` is the input type the plan was made for.
  static KernelSource generate(const AttentionVariant &variant, const schedules::KernelPlan &plan,
                               schedules::InputType input);

  // "sage_attention_<variant>_d128[_causal]_f16_sm90a": a C identifier naming the kernel.
  static std::string kernelName(const AttentionVariant &variant, const schedules::KernelPlan &plan);
};

} // namespace sage::codegen
