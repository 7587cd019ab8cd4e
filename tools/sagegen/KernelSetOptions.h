// Options of commands that generate a variant's kernels for one arch (`emit`, `cache warm`): the preset options
// plus --input and --arch, and the variant's kernels with the keys the runtime will compute for them (a forward
// preset's, an SLA preset's sparse part and SLA module, or a backward preset's module).
#pragma once

#include "PresetOptions.h"

#include "sage/dsl/AttentionBackward.h"
#include "sage/ir/Program.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/AuxiliaryKernels.h"
#include "sage/runtime/SlaRunner.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Tunables.h"

#include <string>
#include <vector>

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
// `tunables`: a tunables text (fields left out keep the schedule's defaults on `arch`, as the C ABI's runners do), or
// empty for the defaults.
inline VariantKernels generateVariantKernels(const PresetOptions &options, schedules::InputType input,
                                             schedules::GpuArch arch, const std::string &tunables = "") {
  ir::Program program = options.builder(options.preset).build();
  VariantKernels kernels;
  kernels.preset = options.preset;
  kernels.variant = program.variant();
  runtime::AttentionKernelRequest request;
  if (!tunables.empty()) {
    try {
      request.tunables =
          schedules::parseTunables(tunables, schedules::scheduledDefaultTunables(kernels.variant, arch, input));
    } catch (const std::invalid_argument &error) {
      throw UserError(std::string("--tunables: ") + error.what());
    }
  }
  request.input = input;
  request.arch = arch;
  request.ir_fingerprint = program.fingerprint();
  kernels.set = runtime::generateAttentionKernels(kernels.variant, request);
  return kernels;
}

// --preset (required unless `preset_optional`), --headdim, --causal, --lse, --input, --arch, --tunables.
struct KernelSetOptions {
  PresetOptions preset;
  std::string input = "f16";
  std::string arch;
  std::string tunables;

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
    command.add_option("--tunables", tunables,
                       "a forward preset's tunables, e.g. block_q=128,block_kv=128,warps=8,stages=4 (fields left out "
                       "keep the schedule's defaults; default: the schedule's)");
  }

  VariantKernels generate() const {
    return generateVariantKernels(preset, parseInputOption(input), parseArchOption(arch), tunables);
  }
};

// Every kernel module a runtime runner of the preset compiles, with the keys it computes: AttentionRunner's for a
// forward preset; an SLA preset's sparse part and SLA module (as sage_sla_create makes them); with `backward`, the
// backward preset's module (as sage_backward_create makes it).
struct PresetKernels {
  std::string preset;
  std::string variant;  // the variant's (or backward program's) name
  std::string schedule; // the plan's schedule
  std::string input;    // "f16" or "bf16"
  int head_dim = 0;
  bool lse = false;
  bool packed = false; // the variant on packed variable-length sequences
  std::vector<runtime::GeneratedKernel> kernels;
};

// The backward preset --preset names, shaped by --headdim/--causal and typed by --input; UserError for --lse or an
// unknown name.
inline dsl::AttentionBackwardBuilder backwardPresetBuilder(const PresetOptions &preset, schedules::InputType input) {
  if (preset.lse)
    throw UserError("--lse: backward presets read the forward's LSE; they have no --lse");
  auto builder = dsl::backwardPreset(preset.preset, preset.head_dim, preset.causal ? MaskKind::causal : MaskKind::none);
  if (!builder) {
    std::string known;
    for (const auto &info : dsl::backwardPresets())
      known += (known.empty() ? "" : ", ") + std::string(info.name);
    throw UserError("--preset: unknown backward preset '" + preset.preset + "'; expected one of " + known);
  }
  builder->float_type(input == schedules::InputType::bf16 ? ElementType::bf16 : ElementType::f16);
  return *builder;
}

// Throws UserError for options that do not fit the preset, std::invalid_argument when no schedule supports it (or,
// with --packed, when the variant cannot be packed: SLA, block-sparse and FP4 presets).
inline PresetKernels generatePresetKernels(const PresetOptions &preset, schedules::InputType input,
                                           schedules::GpuArch arch, bool backward, const std::string &tunables = "") {
  PresetKernels result;
  result.preset = preset.preset;
  result.input = std::string(schedules::nameOf(input));
  result.head_dim = preset.head_dim;
  result.packed = preset.packed;
  if (backward && preset.packed)
    throw UserError("--packed: backward presets are not built for packed sequences");
  if (backward) {
    if (!tunables.empty())
      throw UserError("--tunables: backward presets take their schedule's plan");
    const ir::BackwardProgram program = backwardPresetBuilder(preset, input).build();
    runtime::BackwardKernelSet set =
        runtime::generateBackwardKernels(program.variant(), input, arch, program.fingerprint());
    result.variant = program.name();
    result.schedule = set.plan.schedule;
    result.kernels.push_back(std::move(set.kernel));
    return result;
  }
  AttentionVariant variant;
  try {
    variant = preset.builder(preset.preset).build().variant();
  } catch (const ir::ProgramError &error) { // the IR verifier's reason why this variant cannot be packed
    if (!preset.packed)
      throw;
    throw std::invalid_argument(error.what());
  }
  result.variant = variant.name;
  result.lse = variant.epilogue.write_lse;
  if (!variant.sla.enabled) {
    VariantKernels kernels = generateVariantKernels(preset, input, arch, tunables);
    result.schedule = kernels.set.plan.schedule;
    result.kernels = std::move(kernels.set.kernels);
    return result;
  }
  if (preset.lse)
    throw UserError("--lse: the SLA runner decides whether its sparse part writes the LSE (an exact one does)");
  if (!tunables.empty())
    throw UserError("--tunables: the SLA runner's sparse part takes its mask's blocks");
  const AttentionVariant sparse = slaSparsePart(variant); // as SlaRunner compiles it
  result.lse = sparse.epilogue.write_lse;
  runtime::AttentionKernelRequest request;
  request.input = input;
  request.arch = arch;
  request.ir_fingerprint = dsl::emitProgram(sparse).fingerprint();
  runtime::AttentionKernelSet set = runtime::generateAttentionKernels(sparse, request);
  result.schedule = set.plan.schedule;
  result.kernels = std::move(set.kernels);
  result.kernels.push_back(runtime::generateSlaModule(variant, arch, {}, input));
  return result;
}

inline PresetKernels generatePresetKernels(const KernelSetOptions &options, bool backward) {
  return generatePresetKernels(options.preset, parseInputOption(options.input), parseArchOption(options.arch), backward,
                               options.tunables);
}

} // namespace sage::tool
