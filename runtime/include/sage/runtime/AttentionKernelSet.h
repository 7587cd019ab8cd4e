// Everything a variant needs compiled, before any compiling: the schedule plan, the generated prologue and
// attention kernels in launch order, each with its launch geometry and its cache key (AttentionKernelKeys.h).
// AttentionRunner compiles and loads these; `sagegen emit` writes them out; `sagegen cache warm` caches them.
#pragma once

#include "sage/codegen/KernelSource.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/KernelKey.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/Tunables.h"

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

// backward and sla: the SageBwd and SLA modules (AuxiliaryKernels.h), each one translation unit of several kernels.
enum class AttentionKernelRole { prologue, attention, backward, sla, merge };
std::string_view nameOf(AttentionKernelRole role); // "prologue", "attention", "backward", "sla", "merge"

struct AttentionKernelRequest {
  schedules::InputType input = schedules::InputType::f16;
  schedules::GpuArch arch = schedules::GpuArch::sm80;
  std::optional<schedules::Tunables> tunables; // default: the schedule's
  std::string schedule;                        // a schedule's name to use; empty: the best one for the arch
  std::string ir_fingerprint;                  // ir::Program::fingerprint(), the IR part of every key
};

struct GeneratedKernel {
  AttentionKernelRole role = AttentionKernelRole::attention;
  std::string name;                 // for logs and describe()
  std::string entry_point;          // the extern "C" __global__ function (a backward or SLA module: the module's name)
  std::string source;               // one CUDA C++ translation unit
  bool uses_device_library = false; // the source includes device-library headers (codegen/DeviceLibrary.h)
  std::array<unsigned, 3> block{1, 1, 1};
  int dynamic_shared_bytes = 0;
  std::string grid_rule; // the launch grid in words, as the generator describes it
  KernelKey key;
};

struct AttentionKernelSet {
  schedules::KernelPlan plan;
  codegen::PrologueSource prologue;
  codegen::KernelSource attention;
  std::vector<GeneratedKernel> kernels; // the prologue's launches in order, then the attention kernel
};

// Plans the best schedule for `request.arch`, generates every kernel and computes their keys. Throws
// std::invalid_argument when no schedule or the prologue does not support the variant.
AttentionKernelSet generateAttentionKernels(const AttentionVariant &variant, const AttentionKernelRequest &request);

// `kernel`'s cubin from `cache`, compiled with NVRTC on a miss (CompileError names the kernel and its key digest).
// `compile_milliseconds`, when given, receives the compile time (left alone on a hit).
// `kernel.source` with the device library's headers inlined: one self-contained translation unit (what the key
// hashes and what `sagegen emit` writes).
std::string selfContainedSource(const GeneratedKernel &kernel);

CacheResult cacheKernel(KernelCache &cache, const GeneratedKernel &kernel, double *compile_milliseconds = nullptr);

} // namespace sage::runtime
