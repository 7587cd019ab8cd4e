// The cache keys of generated kernels: a forward variant's (a prologue launch or the attention kernel), the SageBwd
// backward module's and the SLA module's. The one place such keys are made: the runners, `sagegen emit` /
// `sagegen cache warm` and the AOT lookup all call these, so a kernel compiled ahead of time and one asked for at run
// time have byte-identical keys.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/BackwardVariant.h"
#include "sage/runtime/KernelKey.h"
#include "sage/schedules/BackwardSchedule.h"
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

// The backward module of `plan` (all its launches in one translation unit). `ir_fingerprint` is
// ir::BackwardProgram::fingerprint() (may be empty), `module_name` the generator's name for the module, `source` its
// self-contained text (device headers inlined).
KernelKey backwardKernelKey(const std::string &ir_fingerprint, const schedules::BackwardKernelPlan &plan,
                            std::string_view module_name, std::string_view source);

// The SLA module of an SLA variant (mask prediction, linear branch, output and the backward's kernels). The
// variant's sparse part has its own keys (attentionKernelKey); `ir_fingerprint` may be empty. `input`: the module's
// element type (f16 or bf16 Q, K, V, O).
KernelKey slaKernelKey(const std::string &ir_fingerprint, const AttentionVariant &variant, schedules::GpuArch arch,
                       std::string_view module_name, std::string_view source,
                       schedules::InputType input = schedules::InputType::f16);

// The LSE merge module (codegen/MergeKernels.h) of one set of element types: no variant, no IR; `dtypes` names the
// types ("a=f32,b=bf16,o=f32") and the source's hash keeps the key exact.
KernelKey mergeKernelKey(schedules::GpuArch arch, std::string_view dtypes, std::string_view module_name,
                         std::string_view source);

} // namespace sage::runtime
