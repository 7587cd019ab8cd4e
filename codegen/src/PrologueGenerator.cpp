// Assembles the prologue's kernels: one self-contained CUDA source per planned launch.
#include "sage/codegen/PrologueGenerator.h"

#include "sage/codegen/KernelAbiSource.h"
#include "sage/codegen/PrologueConfig.h"
#include "sage/codegen/PrologueDeviceCode.h"
#include "sage/codegen/SourceText.h"

#include <algorithm>
#include <string>

namespace sage::codegen {
namespace {

using namespace prologue;

bool has(const std::vector<PrologueRole> &roles, PrologueRole role) {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

// `text` as comment lines of at most 118 columns; continuation lines are indented two more spaces.
std::string commentLines(const std::string &prefix, const std::string &text) {
  constexpr size_t kWidth = 118;
  std::string lines, line = prefix;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos)
      end = text.size();
    const std::string word = text.substr(start, end - start);
    if (line.size() + word.size() + 1 > kWidth && line.size() > prefix.size() + 2) {
      lines += line + "\n";
      line = prefix + "  ";
    }
    if (line.size() > prefix.size() && line.back() != ' ')
      line += ' ';
    line += word;
    start = end + 1;
  }
  return lines + line + "\n";
}

std::string describeQuantizer(const TokenQuantizerConfig &quantizer) {
  if (quantizer.microscaled())
    return quantizer.groupChannels() == 16 ? "NVFP4: e2m1 codes (2 per byte), one ue4m3 scale per 16 channels"
                                           : "MXFP4: e2m1 codes (2 per byte), one ue8m0 scale per 32 channels";
  if (quantizer.cast())
    return "none: not quantized, rounded to " + std::string(nameOf(quantizer.dtype)) + " (2 bytes per value)";
  std::string text = quantizer.dtype == ElementType::e4m3   ? "e4m3 "
                     : quantizer.dtype == ElementType::int4 ? "int4 (one per byte) "
                                                            : "int8 ";
  switch (quantizer.granularity) {
  case Granularity::per_tensor:
    return text + "per_tensor";
  case Granularity::per_token:
    return text + "per_token";
  case Granularity::per_block:
    return text + "per_block (" + std::to_string(quantizer.group_tokens) + " tokens per scale)";
  case Granularity::per_warp:
    return text + "per_warp (" + std::to_string(quantizer.group_tokens) + " tokens per scale)";
  default:
    return text + "per_thread (" + std::to_string(quantizer.group_tokens) + "-token groups, interleaved by 8)";
  }
}

std::string describeVariant(const PrologueConfig &config) {
  const std::string input = config.input == schedules::InputType::bf16 ? "bf16" : "f16";
  std::string text =
      commentLines("// ", "Variant \"" + sourceSafe(config.variant_name) + "\" (IR v" + std::to_string(kIrVersion) +
                              "): Q, K, V in " + input + ", head_dim " + std::to_string(config.head_dim) + ", b_q " +
                              std::to_string(config.block_q) + ", b_kv " + std::to_string(config.block_kv) + ".");
  if (config.packed_sequences)
    text += commentLines("//   ", "Packed sequences: slot b holds rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 of the "
                                  "caller's tensors; its lengths stand for tokens_q / tokens_kv, statistics per slot.");
  std::string q = "psi_Q: " + describeQuantizer(config.q) + " of ";
  q += config.fold_q_scale ? "Q * 1/sqrt(d) * log2(e) (softmax scale folded in, paper 4.6)" : "Q";
  q += config.smooth_q ? ", minus the mean of each Q block (Q smoothing)" : "";
  text += commentLines("//   ", q);
  if (config.smooth_k)
    text +=
        commentLines("//   ", "phi_K = psi_K o gamma: gamma(K) = K - mean(K) over the sequence (paper 4.2); psi_K: " +
                                  describeQuantizer(config.k));
  else
    text += commentLines("//   ", "psi_K: " + describeQuantizer(config.k) + " of K");
  switch (config.v_output) {
  case VOutput::none:
    text += "//   V: f16 P.V reads the caller's f16 V in place (nothing to write)\n";
    break;
  case VOutput::f16_values:
    text +=
        std::string("//   V: f16 P.V on ") + (config.smooth_v ? "V - mean(V)" : "V") + " rounded to f16 (v_values)\n";
    break;
  case VOutput::codes:
    text += std::string("//   psi_V: per-channel ") + (config.v_dtype == ElementType::e4m3 ? "e4m3" : "int8") + " of " +
            (config.smooth_v ? "V - mean(V)" : "V") + ", codes transposed (paper 4.3)\n";
    if (config.interleavedVCodes())
      text += "//   v_codes' token axis in wgmma order: position p of each 32-token group holds token\n"
              "//     16 (p / 16) + 8 ((p % 4) / 2) + 2 ((p % 16) / 4) + p % 2\n";
    break;
  case VOutput::fp4_codes:
    text += std::string("//   psi_V: ") +
            (config.vGroupTokens() == 16 ? "NVFP4 (ue4m3 scale per 16 tokens)" : "MXFP4 (ue8m0 scale per 32 tokens)") +
            " of V along its tokens: V^T e2m1 codes [d, padded_kv / 2] and scales\n";
    break;
  }
  return text;
}

std::string gridRule(const PrologueConfig &config, const std::vector<PrologueRole> &roles) {
  std::string rule = "gridDim.x = ";
  for (size_t i = 0; i < roles.size(); ++i)
    rule += (i ? " + " : "") + roleSummary(roles[i], config);
  if (has(roles, PrologueRole::k_column_statistics) || has(roles, PrologueRole::v_column_statistics))
    rule += "; slices = min(max(1, ceil(" + std::to_string(config.statistics_ctas_per_tensor) +
            " / (batch * heads_kv))), ceil(tokens_kv / " + std::to_string(config.tunables.statistics_min_slice_tokens) +
            "), " + std::to_string(config.tunables.max_statistics_slices) + ")";
  return rule;
}

std::string header(const PrologueConfig &config, const std::vector<PlannedLaunch> &plan, size_t index) {
  std::string text = "// sagegen quantization prologue, launch " + std::to_string(index + 1) + " of " +
                     std::to_string(plan.size()) + ": " + plan[index].entry_point + ". Generated code.\n";
  text += describeVariant(config);
  text += "// Launches, in order on one stream, all with the same SagePrologueParams:\n";
  for (size_t i = 0; i < plan.size(); ++i) {
    text += "//   " + std::to_string(i + 1) + ". " + plan[i].entry_point + " (" + plan[i].name + "):\n";
    for (PrologueRole role : plan[i].roles)
      text += commentLines("//        ", roleSummary(role, config));
  }
  text += commentLines("// ", "This launch: blockDim.x = kThreads, " + gridRule(config, plan[index].roles) + ".");
  return text;
}

// Hands `cta` (counted from 0 over `roles`' CTA ranges, in order) to its role's function.
std::string roleDispatch(const PrologueConfig &config, const std::vector<PrologueRole> &roles) {
  std::string text;
  for (size_t i = 0; i < roles.size(); ++i) {
    const PrologueRole role = roles[i];
    const std::string count = std::string(nameOf(role)) + "_ctas";
    text += commentLines("  // ", roleSummary(role, config));
    std::string declaration = "  const long long " + count + " = " + roleCtaCountExpression(role) + ";\n";
    if (declaration.size() > 121)
      declaration = "  const long long " + count + " =\n      " + roleCtaCountExpression(role) + ";\n";
    text += declaration;
    text += "  if (cta < " + count + ")\n    return " + roleFunctionName(role, config) + "(params, cta, shared);\n";
    if (i + 1 < roles.size())
      text += "  cta -= " + count + ";\n";
  }
  return text;
}

std::string entry(const PrologueConfig &config, const PlannedLaunch &launch) {
  std::string text = "\n// ---- The launch: each CTA finds its role from blockIdx.x ----\n";
  text += "extern \"C\" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)\n" + launch.entry_point +
          "(const __grid_constant__ SagePrologueParams params) {\n";
  text += "  __shared__ __align__(16) unsigned char shared[kSharedBytes];\n";
  text += "  long long cta = blockIdx.x;\n";
  text += "  clearLaunchWord(params);\n";
  return text + roleDispatch(config, launch.roles) + "}\n";
}

// The one-pass launch: what the variant decides (which role functions do each kind of work, and the roles that wait
// for nothing, dispatched by CTA range) as OnePassRoles; the ticket, the waits and the publishing are
// runOnePassCta's (sage/device/prologue/one_pass.cuh).
std::string onePassEntry(const PrologueConfig &config, const PlannedLaunch &launch) {
  const auto waits = [&](PrologueRole role) {
    switch (role) {
    case PrologueRole::k_column_statistics:
    case PrologueRole::v_column_statistics:
      return true;
    case PrologueRole::k_block_quantize:
      return config.kStatistics();
    case PrologueRole::v_tile_quantize:
    case PrologueRole::v_tile_convert:
      return config.vStatistics();
    default:
      return false;
    }
  };
  std::vector<PrologueRole> independent;
  for (PrologueRole role : launch.roles)
    if (!waits(role))
      independent.push_back(role);
  std::string text = "\n// ---- The roles that wait for nothing, by CTA range ----\n";
  text += "__device__ __forceinline__ void runIndependentRole(const SagePrologueParams &params, long long cta,\n"
          "                                                   unsigned char *shared) {\n";
  text += roleDispatch(config, independent) + "}\n";
  std::string independent_ctas;
  for (PrologueRole role : independent)
    independent_ctas += (independent_ctas.empty() ? "" : " +\n         ") + roleCtaCountExpression(role);
  text += "\n// ---- What each kind of one-pass work runs (runOnePassCta, one_pass.cuh) ----\n";
  text += "struct OnePassRoles {\n";
  const std::string head = "  static __device__ __forceinline__ ";
  const std::string arguments = "(const SagePrologueParams &params, long long cta, unsigned char *shared) {\n";
  const auto member = [&](const char *name, const std::string &body) {
    text += head + "void " + name + arguments + "    " + body + "\n  }\n";
  };
  for (PrologueRole role : launch.roles) {
    if (!waits(role))
      continue;
    const std::string call = roleFunctionName(role, config) + "(params, cta, shared);";
    member(role == PrologueRole::k_column_statistics   ? "kStatistics"
           : role == PrologueRole::v_column_statistics ? "vStatistics"
           : role == PrologueRole::k_block_quantize    ? "kTile"
                                                       : "vTile",
           call);
  }
  member("independent", "runIndependentRole(params, cta, shared);");
  // The head's statistics, combined once by its last statistics CTA (publishStatistics).
  std::string combine;
  if (config.kStatistics())
    combine += std::string("combineKStatisticsOnce<") + (config.smooth_k ? "true" : "false") + ", " +
               (config.kMinMax() ? "true" : "false") + ">(params, head, (unsigned *)shared);\n    ";
  if (config.vStatistics())
    combine += std::string("combineVStatisticsOnce<") + (config.smooth_v ? "true" : "false") + ", " +
               (config.vMinMax() ? "true, VQuantizer" : "false") + ">(params, head);\n    ";
  text += head + "void combine(const SagePrologueParams &params, long long head, unsigned char *shared) {\n    " +
          combine + "(void)shared;\n  }\n";
  text += head + "long long independentCtas(const SagePrologueParams &params) {\n    return " + independent_ctas +
          ";\n  }\n};\n";
  text += "\n// ---- The launch: each CTA draws a ticket, which orders the work (one_pass.cuh) ----\n";
  text += "extern \"C\" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)\n" + launch.entry_point +
          "(const __grid_constant__ SagePrologueParams params) {\n";
  text += "  __shared__ __align__(16) unsigned char shared[kSharedBytes];\n";
  text += "  clearLaunchWord(params);\n";
  text += "  runOnePassCta<OnePassRoles>(params, shared);\n}\n";
  return text;
}

PrologueKernel emitKernel(const PrologueConfig &config, const std::vector<PlannedLaunch> &plan, size_t index) {
  const PlannedLaunch &launch = plan[index];
  const std::vector<PrologueRole> &roles = launch.roles;
  const bool column_reduction =
      has(roles, PrologueRole::k_column_statistics) || has(roles, PrologueRole::v_column_statistics);

  std::string source = header(config, plan, index);
  source += "\n";
  source += kernelAbiSource();
  source += "\n";
  source += emitConstants(config);
  source += emitBasicHelpers(config);
  source += emitCodeHelpers(config);
  source += emitTokenQuantizer("QQuantizer", config.q, "kBlockQ", 1, "psi_Q");
  source += emitTokenQuantizer("KQuantizer", config.k, "kKTileTokens", config.tunables.k_blocks_per_tile, "psi_K");
  source += emitSharedBudgets(roles);
  source += emitTileLibrary();
  if (config.usesStatisticsScratch())
    source += emitStatisticsScratch(config, column_reduction);
  source += emitRoleSupport(config, roles);
  for (PrologueRole role : roles)
    source += emitRoleFunction(role, config);
  source += launch.one_pass ? onePassEntry(config, launch) : entry(config, launch);

  PrologueKernel kernel;
  kernel.name = launch.name;
  kernel.entry_point = launch.entry_point;
  kernel.source = std::move(source);
  kernel.block_threads = config.tunables.threads;
  kernel.roles = roles;
  kernel.one_pass = launch.one_pass;
  kernel.grid_rule = gridRule(config, roles);
  return kernel;
}

} // namespace

PrologueSource PrologueGenerator::generate(const AttentionVariant &variant, schedules::InputType input, int head_dim,
                                           const PrologueTunables &tunables, const PrologueOptions &options) {
  const PrologueConfig config = makePrologueConfig(variant, input, head_dim, tunables, options);
  const std::vector<PlannedLaunch> plan = planPrologueLaunches(config);
  PrologueSource prologue;
  prologue.variant_name = variant.name;
  prologue.input = input;
  prologue.options = options;
  prologue.geometry = config.geometry();
  for (size_t index = 0; index < plan.size(); ++index)
    prologue.kernels.push_back(emitKernel(config, plan, index));
  return prologue;
}

} // namespace sage::codegen
