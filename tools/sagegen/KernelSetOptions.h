// Options of commands that generate a variant's kernels for one arch (`emit`, `cache warm`): the preset options
// plus --input and --arch, and the variant's kernels with the keys the runtime will compute for them.
#pragma once

#include "PresetOptions.h"

#include "sage/ir/Program.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"

#include <string>

namespace sage::tool {

inline schedules::InputType parseInputOption(const std::string &text) {
  if (const std::optional<schedules::InputType> input = schedules::parseInputType(text))
    return *input;
  throw UserError("--input: expected f16 or bf16, got '" + text + "'");
}

inline schedules::GpuArch parseArchOption(const std::string &text) {
  if (std::optional<schedules::GpuArch> arch = schedules::parseArch(text))
    return *arch;
  throw UserError("--arch: unknown architecture '" + text +
                  "'; expected one of sm_80, sm_86, sm_89, sm_90a, sm_100f, sm_120f");
}

// One variant of a preset, generated for one arch and input type.
struct VariantKernels {
  std::string preset;
  AttentionVariant variant;
  runtime::AttentionKernelSet set;
};

// Builds the preset's program (so the keys carry its IR fingerprint, as the C ABI's and Python's runners do) and
// generates its kernels. Throws std::invalid_argument when no schedule supports the variant on `arch`.
inline VariantKernels generateVariantKernels(const PresetOptions &options, schedules::InputType input,
                                             schedules::GpuArch arch) {
  ir::Program program = options.builder(options.preset).build();
  VariantKernels kernels;
  kernels.preset = options.preset;
  kernels.variant = program.variant();
  runtime::AttentionKernelRequest request;
  request.input = input;
  request.arch = arch;
  request.ir_fingerprint = program.fingerprint();
  kernels.set = runtime::generateAttentionKernels(kernels.variant, request);
  return kernels;
}

// --preset (required unless `preset_optional`), --headdim, --causal, --lse, --input, --arch.
struct KernelSetOptions {
  PresetOptions preset;
  std::string input = "f16";
  std::string arch;

  void addTo(CLI::App &command, bool preset_optional = false) {
    CLI::Option *preset_option = command.add_option("--preset", preset.preset, "preset name (see `sagegen list`)");
    if (!preset_optional)
      preset_option->required();
    preset.addTo(command);
    command.add_option("--input", input, "storage type of Q, K, V and O: f16 or bf16")->capture_default_str();
    CLI::Option *arch_option =
        command.add_option("--arch", arch, "target architecture: sm_80, sm_86, sm_89, sm_90a, sm_100f, sm_120f");
    if (!preset_optional)
      arch_option->required();
  }

  VariantKernels generate() const {
    return generateVariantKernels(preset, parseInputOption(input), parseArchOption(arch));
  }
};

} // namespace sage::tool
