// `sagegen emit`'s work: generate the kernels of a list of (preset, head dim, mask, input, arch) targets (forward,
// SLA and backward presets: KernelSetOptions.h's generatePresetKernels), compile
// each distinct (source, arch) once with NVRTC (for ptxas's resource report, and for the PTX / cubin files when
// asked), write the files named by content and one manifest.json (runtime/AotManifest.h) for the directory.
#pragma once

#include "sage/runtime/AotManifest.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"

#include <filesystem>
#include <string>
#include <vector>

namespace sage::tool {

// The .cu is always written (the manifest names it); ptx and cubin add the compiled file, all adds both.
enum class EmitFormat { cu, ptx, cubin, all };

struct EmitTarget {
  std::string preset;
  int head_dim = 128;
  bool causal = false;
  bool lse = false;
  schedules::InputType input = schedules::InputType::f16;
  schedules::GpuArch arch = schedules::GpuArch::sm80;
  bool backward = false;  // `preset` is a backward preset: its SageBwd module (an SLA preset needs no flag)
  std::string tunables{}; // a forward preset's tunables text (empty: the schedule's defaults)
  bool packed = false;    // the variant on packed variable-length sequences (what sage_attention_run_varlen runs)
};

struct EmitOptions {
  std::filesystem::path directory;
  EmitFormat format = EmitFormat::cu;
  unsigned jobs = 0;             // parallel NVRTC compilations; 0: one per hardware thread
  bool skip_unsupported = false; // record unsupported targets in the manifest's "skipped" (else: an error)
};

struct EmitReport {
  runtime::AotManifest manifest;
  std::size_t files_written = 0;
  std::vector<std::string> files_removed; // listed by the directory's previous manifest, not written again
};

// The committed default set: every preset x input {f16, bf16} x head dim {64, 128} x {no mask, causal} x
// {sm_80, sm_89, sm_90a}; dense only (packed kernels would double the set CI compiles; they JIT on first use).
std::vector<EmitTarget> defaultEmitTargets();

// Throws UserError for unsupported targets (unless skip_unsupported) and for an unwritable directory.
EmitReport emitKernels(const std::vector<EmitTarget> &targets, const EmitOptions &options);

} // namespace sage::tool
