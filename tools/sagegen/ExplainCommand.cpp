// `sagegen explain`: why a variant gets the kernel it gets on one arch. Every schedule's verdict in the arch's
// order of preference, the one chosen, and the main facts of its default plan (what codegen will write).
#include "IrFile.h"
#include "KernelSetOptions.h"

#include "sage/dsl/Attention.h"
#include "sage/ir/Legalize.h"
#include "sage/ir/Program.h"
#include "sage/schedules/BackwardSchedule.h"
#include "sage/schedules/ScheduleRegistry.h"

#include <fmt/core.h>

#include <memory>
#include <optional>
#include <sstream>

namespace sage::tool {
namespace {

struct ExplainOptions {
  KernelSetOptions kernel;
  std::string ir_file;
  bool preset_shape_given =
      false;             // --headdim, --causal, --lse or --packed: they shape a preset, an IR file has its own
  bool backward = false; // --preset names a backward preset
};

std::string_view pvPathName(schedules::PvPath path) {
  switch (path) {
  case schedules::PvPath::f16_accumulate_f16:
    return "f16 P x f16 V, f16 accumulator";
  case schedules::PvPath::f16_accumulate_f32:
    return "f16 P x f16 V, f32 accumulator";
  case schedules::PvPath::int8_per_block:
    return "int8 P x int8 V^T, s32 per KV block added into f32";
  case schedules::PvPath::e4m3_accumulate_f32:
    return "e4m3 P x e4m3 V^T, f32 accumulator";
  case schedules::PvPath::e2m1_block_scaled:
    return "e2m1 P (microscaled in registers) x e2m1 V^T, block-scaled mma, f32 accumulator";
  case schedules::PvPath::e2m1_decoded:
    return "e2m1 P (microscaled in registers) x e2m1 V^T, both decoded exactly to the mma's type, f32 accumulator";
  }
  return "?";
}

std::string_view valueSourceName(schedules::ValueSource source) {
  switch (source) {
  case schedules::ValueSource::input:
    return "the caller's V in place";
  case schedules::ValueSource::workspace_values:
    return "workspace v_values (f16 copy from the prologue)";
  case schedules::ValueSource::workspace_codes:
    return "workspace v_codes (8-bit or e2m1, transposed, from the prologue)";
  }
  return "?";
}

std::string mmaText(const schedules::MmaShape &mma) {
  return fmt::format("m{}n{}k{} {}.{} -> {}", mma.m, mma.n, mma.k, nameOf(mma.a), nameOf(mma.b),
                     nameOf(mma.accumulator));
}

ir::Program programFromFile(const std::string &path) {
  return ir::Program::parse(readIrFile(path, "--ir"), path); // ProgramError with file:line:col
}

// What `sagegen ir --legalize <arch>` does to the program: its sage.decode ops (FP4/INT4 operands the target's tensor
// cores cannot multiply, decoded exactly), one line.
std::string legalizationSummary(const ir::Program &program, schedules::GpuArch arch) {
  const std::string target(schedules::archName(arch));
  if (!ir::targetCapabilities(target))
    return "no legalization target " + target;
  std::string decodes;
  int count = 0;
  std::istringstream lines(ir::legalizeForTarget(program, target).print());
  for (std::string line; std::getline(lines, line);)
    if (const size_t at = line.find("sage.decode "); at != std::string::npos) {
      decodes += (count++ ? ", " : "") + line.substr(at + 12);
    }
  return count == 0 ? "no sage.decode (the target multiplies every operand as the program says)"
                    : std::to_string(count) + " sage.decode: " + decodes + " (emulation)";
}

void printPlan(const schedules::KernelPlan &plan, const AttentionVariant &variant) {
  const schedules::SharedMemoryLayout &shared = plan.shared;
  fmt::print("  tunables     {}\n", schedules::tunablesText(plan.tunables));
  const schedules::WarpSpecialization &ws = plan.warp_specialization;
  if (ws.consumer_warpgroups > 0) {
    if (ws.producer_warpgroup)
      fmt::print("  threads      {} (1 producer warpgroup, {} consumer warpgroups of 64 Q rows)\n", plan.threads,
                 ws.consumer_warpgroups);
    else
      fmt::print("  threads      {} (no producer warpgroup: {} consumer warpgroup of 64 Q rows issues its own TMA "
                 "loads)\n",
                 plan.threads, ws.consumer_warpgroups);
    if (ws.producer_registers > 0)
      fmt::print("  registers    setmaxnreg: producer {}, consumers {}\n", ws.producer_registers,
                 ws.consumer_registers);
    fmt::print("  TMA boxes    Q {}x{} B, K {}x{} B, V {}x{} B (rows x bytes)\n", ws.q_box.rows, ws.q_box.inner_bytes,
               ws.k_box.rows, ws.k_box.inner_bytes, ws.v_box.rows, ws.v_box.inner_bytes);
  } else {
    fmt::print("  threads      {} ({} warps, {} Q rows each)\n", plan.threads, plan.tunables.warps, plan.rows_per_warp);
  }
  fmt::print("  shared       {} bytes (Q {}, {} stages of {}: K {}, V {}, K scales {})\n", shared.total_bytes,
             shared.q.bytes, shared.stages, shared.stage_bytes, shared.k.bytes, shared.v.bytes, shared.k_scales.bytes);
  fmt::print("  occupancy    {} CTA(s) per SM (__launch_bounds__)\n", plan.min_blocks_per_multiprocessor);
  if (plan.block_sparse)
    fmt::print("  mask         block-sparse: the CTA's block_mask row read once into a shared-memory bitmask; the "
               "producer and the consumers visit its kept KV blocks only\n");
  fmt::print("  Q.K^T mma    {}\n", mmaText(plan.qk_mma));
  if (variant.q.dtype != plan.qk_mma.a && variant.q.quantized())
    fmt::print("               {} codes decoded to {} (the legalized program's operands, also where the target "
               "multiplies {} natively)\n",
               nameOf(variant.q.dtype), nameOf(plan.qk_mma.a), nameOf(variant.q.dtype));
  fmt::print("  P.V mma      {}\n", mmaText(plan.pv_mma));
  fmt::print("  P.V path     {}\n", pvPathName(plan.pv_path));
  fmt::print("  V source     {}\n", valueSourceName(plan.v_source));
  if (plan.pv_path == schedules::PvPath::e2m1_decoded) {
    const std::string_view scale = plan.fp4_scale_group == 16 ? "ue4m3" : "ue8m0";
    const std::string_view decoded = nameOf(plan.qk_mma.a);
    fmt::print("  FP4          FP4 by emulation: decode e2m1 x {} to {} (exact), {} mma.sync, f32 accumulation; {} "
               "elements per scale; P {}; {}\n",
               scale, decoded, decoded, plan.fp4_scale_group,
               plan.fp4_two_level_p ? "two-level (s_P1 = rowmax / 2688, then microscales), microscaled in registers"
                                    : "microscaled directly in registers",
               plan.fp4_delta_s ? "S += delta_s (Q smoothing)" : "no delta_s");
  } else if (plan.fp4_scale_group > 0)
    fmt::print("  FP4          {} scales per {} elements; P {}; {}; K rows read permuted in shared memory ({}), "
               "k_codes natural\n",
               plan.fp4_scale_group == 16 ? "ue4m3" : "ue8m0", plan.fp4_scale_group,
               plan.fp4_two_level_p ? "two-level (s_P1 = rowmax / 2688, then microscales)" : "microscaled directly",
               plan.fp4_delta_s ? "S += delta_s (Q smoothing)" : "no delta_s",
               plan.fp4_permute_k_rows_in_shared ? "S = P's A operand" : "no");
  fmt::print("  grid         {}\n", plan.grid.description());
}

// Every schedule's verdict for `variant`, the one chosen and its default plan; false when none supports it.
bool explainVariant(const ir::Program &program, const AttentionVariant &variant, schedules::GpuArch arch,
                    schedules::InputType input) {
  fmt::print("variant '{}' d{} {}{}, {} inputs, on {}\n", variant.name, variant.head_dim, nameOf(variant.mask.kind),
             variant.epilogue.write_lse ? ", with LSE" : "", schedules::nameOf(input), schedules::archName(arch));
  fmt::print("legalized for {}: {}\n", schedules::archName(arch), legalizationSummary(program, arch));
  if (variant.packed_sequences) // issue 28
    fmt::print("packed sequences: each sequence's lengths and first rows from cu_seqlens, its statistics and causal "
               "alignment its own; the workspace keeps the dense layout (batch = sequences, tokens = the maximum "
               "lengths)\n");
  if (variant.q.rotation_seed) // issue 28
    fmt::print("rotation: Q and K rotated along d by a randomized Hadamard transform (seed {}) before quantization, "
               "in the prologue\n",
               *variant.q.rotation_seed);
  fmt::print("schedules, most preferred first:\n");
  std::optional<std::string_view> chosen;
  int rank = 0;
  for (const schedules::ScheduleVerdict &verdict : schedules::scheduleVerdicts(variant, arch, input)) {
    const schedules::Schedule *schedule = schedules::findSchedule(verdict.schedule);
    fmt::print("  {}. {}: {}\n", ++rank, verdict.schedule,
               verdict.support ? "supported" : "unsupported: " + verdict.support.reason);
    if (schedule != nullptr)
      fmt::print("     {}\n", schedule->summary());
    if (verdict.support && !chosen)
      chosen = verdict.schedule;
  }
  if (!chosen)
    return false;
  const schedules::KernelPlan plan = schedules::planBestSchedule(variant, arch, input);
  fmt::print("chosen: {} (default plan)\n", plan.schedule);
  printPlan(plan, variant);
  return true;
}

// Every backward schedule's verdict for a backward preset, the one chosen and its plan.
void explainBackward(const ExplainOptions &options, schedules::GpuArch arch, schedules::InputType input) {
  if (!options.ir_file.empty())
    throw UserError("--backward: takes a backward --preset (an --ir file is a forward program)");
  const BackwardVariant variant = backwardPresetBuilder(options.kernel.preset, input).describe();
  fmt::print("backward variant '{}' d{} {}, {} inputs, on {}\n", variant.name, variant.head_dim, nameOf(variant.mask),
             schedules::nameOf(input), schedules::archName(arch));
  fmt::print("backward schedules, most preferred first:\n");
  const schedules::BackwardSchedule *chosen = nullptr;
  int rank = 0;
  for (const schedules::BackwardSchedule *schedule : schedules::allBackwardSchedules()) {
    const schedules::SupportResult support = schedule->supports(variant, arch, input);
    fmt::print("  {}. {}: {}\n     {}\n", ++rank, schedule->name(),
               support ? "supported" : "unsupported: " + support.reason, schedule->summary());
    if (support && chosen == nullptr)
      chosen = schedule;
  }
  if (chosen == nullptr) {
    fmt::print("chosen: none (no backward schedule supports this variant on {})\n", schedules::archName(arch));
    throw UserError("no backward schedule supports '" + variant.name + "' on " +
                    std::string(schedules::archName(arch)));
  }
  const schedules::BackwardKernelPlan plan = chosen->plan(variant, arch, input);
  fmt::print("chosen: {}\n  plan         {}\n", plan.schedule, plan.describe());
  for (const schedules::BackwardLaunch &launch : plan.launches)
    fmt::print("  launch       {} ({} threads, {} bytes of dynamic shared memory, {} tokens per CTA)\n",
               launch.entry_point, launch.threads, launch.dynamic_shared_bytes, launch.tile_tokens);
}

void explain(const ExplainOptions &options) {
  if (options.kernel.preset.preset.empty() == options.ir_file.empty())
    throw UserError("--preset/--ir: name exactly one of a preset (see `sagegen list`) or an IR file");
  if (!options.ir_file.empty() && options.preset_shape_given)
    throw UserError("--headdim/--causal/--lse/--packed: they apply to --preset; an --ir file sets its own");
  if (options.kernel.arch.empty())
    throw UserError("--arch: name the target architecture (sm_80, sm_86, sm_89, sm_90a, sm_100f, sm_120f)");
  const schedules::GpuArch arch = parseArchOption(options.kernel.arch);
  const schedules::InputType input = parseInputOption(options.kernel.input);
  if (options.backward) {
    if (options.kernel.preset.packed)
      throw UserError("--packed: the backward is not built for packed sequences");
    return explainBackward(options, arch, input);
  }
  const ir::Program program = options.ir_file.empty()
                                  ? options.kernel.preset.builder(options.kernel.preset.preset).build()
                                  : programFromFile(options.ir_file);
  const AttentionVariant variant = program.variant();

  if (variant.sla.enabled) {
    // No attention schedule runs an SLA variant whole: the SLA module predicts the mask and computes the linear
    // branch, and the runner hands the critical blocks to the variant without `sla` (block_sparse).
    const AttentionVariant sparse = slaSparsePart(variant); // as SlaRunner compiles it
    fmt::print("SLA variant '{}': mask prediction, the linear branch and the combine run in the SLA module; its "
               "sparse part (the variant without `sla`, block_sparse over the critical blocks, writing its LSE "
               "where it is exact) is planned as:\n",
               variant.name);
    if (!explainVariant(dsl::emitProgram(sparse), sparse, arch, input)) {
      fmt::print("chosen: none (no schedule supports the sparse part on {})\n", schedules::archName(arch));
      throw UserError("no schedule supports the sparse part of '" + variant.name + "' on " +
                      std::string(schedules::archName(arch)));
    }
    return;
  }
  if (!explainVariant(program, variant, arch, input)) {
    fmt::print("chosen: none (no schedule supports this variant on {})\n", schedules::archName(arch));
    throw UserError("no schedule supports variant '" + variant.name + "' on " + std::string(schedules::archName(arch)));
  }
}

} // namespace

CommandAction addExplainCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand(
      "explain", "every schedule's verdict for a variant on one arch, the one chosen and its plan's main facts");
  auto options = std::make_shared<ExplainOptions>();
  options->kernel.preset.preset.clear(); // --preset or --ir
  options->kernel.addTo(*command, /*preset_optional=*/true);
  options->kernel.preset.addPackedTo(*command);
  command->add_option("--ir", options->ir_file, "a textual sage IR file instead of --preset");
  command->add_flag("--backward", options->backward,
                    "--preset is a backward preset (sagebwd, sagebwd-int8-dp, exact-bwd): the backward schedules' "
                    "verdicts");
  return [options, command] {
    for (const char *name : {"--headdim", "--causal", "--lse", "--packed"})
      options->preset_shape_given = options->preset_shape_given || command->get_option(name)->count() > 0;
    explain(*options);
  };
}

} // namespace sage::tool
