// The kernels beside a forward variant's, ready for the kernel cache: the SageBwd backward module of a
// BackwardVariant and the SLA module of an SLA variant, each generated for one arch with its cache key
// (AttentionKernelKeys.h). AttentionBackwardRunner and SlaRunner compile them through cacheKernel();
// `sagegen cache warm --backward` and `sagegen cache warm --preset sla-*` cache them without a GPU.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/BackwardVariant.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/schedules/BackwardSchedule.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"

#include <string>

namespace sage::runtime {

struct BackwardKernelSet {
  schedules::BackwardKernelPlan plan;
  GeneratedKernel kernel; // role backward: every launch of the plan, entry points plan.launches[i].entry_point
};

// Plans the best backward schedule for `arch` (std::invalid_argument with each schedule's reason when none supports
// the variant) and generates its module. `ir_fingerprint`: ir::BackwardProgram::fingerprint(), may be empty.
BackwardKernelSet generateBackwardKernels(const BackwardVariant &variant, schedules::InputType input,
                                          schedules::GpuArch arch, const std::string &ir_fingerprint = {});

// The SLA module (role sla; entry points codegen::SlaKernelSource::entry_points). Throws std::invalid_argument
// naming the field for a variant that is not SLA or a head dim the SLA kernels do not take. `input`: the element type
// of Q, K, V, O^s and O.
GeneratedKernel generateSlaModule(const AttentionVariant &variant, schedules::GpuArch arch,
                                  const std::string &ir_fingerprint = {},
                                  schedules::InputType input = schedules::InputType::f16);

} // namespace sage::runtime
