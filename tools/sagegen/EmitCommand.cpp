// `sagegen emit`: writes a variant's kernels (prologue + attention; an SLA preset's SLA module too; with --backward a
// backward preset's SageBwd module; with --packed the packed variable-length variant's, which
// sage_attention_run_varlen loads) and a manifest.json into a directory, or, with --defaults, the committed default
// set of generated/ (dense kernels only).
#include "AotEmitter.h"
#include "KernelSetOptions.h"

#include <fmt/core.h>

#include <filesystem>
#include <memory>

namespace sage::tool {
namespace {

struct EmitCommandOptions {
  KernelSetOptions kernels;
  bool defaults = false;
  bool backward = false;
  std::string format = "cu";
  std::string output;
  unsigned jobs = 0;
  bool preset_given = false, arch_given = false;
};

EmitFormat parseFormat(const std::string &text) {
  if (text == "cu")
    return EmitFormat::cu;
  if (text == "ptx")
    return EmitFormat::ptx;
  if (text == "cubin")
    return EmitFormat::cubin;
  if (text == "all")
    return EmitFormat::all;
  throw UserError("--format: expected cu, ptx, cubin or all, got '" + text + "'");
}

void run(const EmitCommandOptions &options) {
  EmitOptions emit;
  emit.directory = options.output;
  emit.format = parseFormat(options.format);
  emit.jobs = options.jobs;
  std::vector<EmitTarget> targets;
  if (options.defaults) {
    if (options.preset_given || options.arch_given || options.backward || options.kernels.preset.packed ||
        !options.kernels.tunables.empty())
      throw UserError("--defaults: emits every preset for sm_80, sm_89 and sm_90a; do not combine it with "
                      "--preset, --arch, --backward, --packed or --tunables");
    targets = defaultEmitTargets();
    emit.skip_unsupported = true;
  } else {
    if (!options.preset_given)
      throw UserError("--preset: required (or --defaults for the default set)");
    if (!options.arch_given)
      throw UserError("--arch: required (or --defaults for the default set)");
    const PresetOptions &preset = options.kernels.preset;
    if (!options.backward)
      preset.builder(preset.preset); // an unknown preset is the user's mistake: say so before generating
    EmitTarget target{preset.preset,
                      preset.head_dim,
                      preset.causal,
                      preset.lse,
                      parseInputOption(options.kernels.input),
                      parseArchOption(options.kernels.arch),
                      options.backward,
                      options.kernels.tunables};
    target.packed = preset.packed;
    targets.push_back(std::move(target));
  }

  EmitReport report = emitKernels(targets, emit);
  const runtime::AotManifest &manifest = report.manifest;
  fmt::print("wrote {} kernels of {} variants ({} files) and {}\n", manifest.kernels.size(),
             targets.size() - manifest.skipped.size(), report.files_written - 1,
             (std::filesystem::path(options.output) / runtime::kAotManifestFileName).string());
  for (const std::string &file : report.files_removed)
    fmt::print("removed {} (listed by the previous manifest, no longer emitted)\n", file);
  for (const runtime::AotSkippedVariant &skipped : manifest.skipped)
    fmt::print("skipped {} d{}{}{} {} {}: {}\n", skipped.preset, skipped.head_dim, skipped.causal ? " causal" : "",
               skipped.packed ? " packed" : "", skipped.input, skipped.arch, skipped.reason);
}

} // namespace

CommandAction addEmitCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("emit", "write a variant's kernels (.cu, .ptx, .cubin) and a manifest.json");
  auto options = std::make_shared<EmitCommandOptions>();
  options->kernels.addTo(*command, /*preset_optional=*/true);
  options->kernels.preset.addPackedTo(*command);
  command->add_flag("--defaults", options->defaults,
                    "the committed default set: every preset x head dim {64,128} x causal {no,yes} x "
                    "{sm_80, sm_89, sm_90a} x input {f16, bf16}");
  command->add_flag("--backward", options->backward,
                    "--preset is a backward preset (sagebwd, sagebwd-int8-dp, exact-bwd): emit its SageBwd module "
                    "(an SLA preset emits its sparse part's kernels and the SLA module without a flag)");
  command->add_option("--format", options->format, "cu, ptx, cubin or all (the .cu is always written)")
      ->capture_default_str();
  command->add_option("-o,--output", options->output, "output directory (created if missing)")->required();
  command->add_option("--jobs", options->jobs, "parallel NVRTC compilations (default: one per hardware thread)");
  return [options, command] {
    options->preset_given = command->count("--preset") > 0;
    options->arch_given = command->count("--arch") > 0;
    run(*options);
  };
}

} // namespace sage::tool
