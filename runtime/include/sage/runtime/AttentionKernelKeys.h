// The cache key of one generated attention-variant kernel (a prologue launch or the attention kernel). The one
// place such keys are made: AttentionRunner, `sagegen emit` / `sagegen cache warm` and the AOT lookup all call it,
// so a kernel emitted ahead of time and one asked for at run time have byte-identical keys.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/runtime/KernelKey.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"

#include <string>
#include <string_view>

namespace sage::runtime {

// `ir_fingerprint` is ir::Program::fingerprint() (may be empty: the source's own SHA-256 in `extra` keeps the key
// exact), `plan` the plan the kernel was generated from, `source` its CUDA C++ text. The NVRTC and sagegen
// versions are this process's.
KernelKey attentionKernelKey(const std::string &ir_fingerprint, const AttentionVariant &variant,
                             const schedules::KernelPlan &plan, schedules::InputType input, schedules::GpuArch arch,
                             std::string_view entry_point, std::string_view source);

} // namespace sage::runtime
