// The role functions of the generated prologue kernels: what one CTA of each role does. The column statistics, Q
// and V roles are templates of sage/device/prologue/*.cuh: their function here is the variant's comment and one
// call. The K role is still generated text: lines that depend on the variant (smoothing, per-tensor scales, Q
// smoothing's correction) are added only when the variant has them. PrologueSupportSources.cpp pastes the headers.
#include "sage/codegen/PrologueDeviceCode.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::codegen::prologue {
namespace {

std::string functionHead(const std::string &comment, const std::string &name) {
  const std::string head = "__device__ __forceinline__ void " + name + "(";
  const std::string parameters = "const SagePrologueParams &params, long long cta, unsigned char *shared) {\n";
  if (head.size() + parameters.size() <= 121)
    return "\n" + comment + head + parameters;
  return "\n" + comment + head + "\n    " + parameters;
}

// ---- the role functions ----

std::string columnStatistics(const PrologueConfig &config, bool k) {
  const bool sum = k ? config.smooth_k : config.smooth_v;
  const bool min_max = k ? config.kMinMax() : config.vMinMax();
  std::string comment = "// Launch 1, " + std::string(k ? "K" : "V") + ": ";
  if (k)
    comment += sum && min_max ? "the per-channel sums for mean(K) (gamma(K) = K - mean(K), paper 4.2)\n// and "
                                "min/max for the per-tensor psi_K"
               : sum          ? "the per-channel sums for mean(K) (gamma(K) = K - mean(K), paper 4.2)"
                              : "the per-channel min/max for the per-tensor psi_K";
  else
    comment += sum && min_max ? "the per-channel sums for mean(V) and min/max for the per-channel psi_V"
               : sum          ? "the per-channel sums for mean(V) (V smoothing)"
                              : "the per-channel min/max for the per-channel psi_V (paper 4.3)";
  comment += ",\n// over one slice of one KV head's tokens, into prologue_statistics. Launch 2 combines the slices in "
             "order.\n";
  return functionHead(comment, k ? "reduceKColumns" : "reduceVColumns") + "  reduceColumnsOfSlice<" +
         (k ? "true" : "false") + ", " + (sum ? "true" : "false") + ", " + (min_max ? "true" : "false") +
         ">(params, cta, shared);\n}\n";
}

// A psi_Q role's function: the variant's comment, then `role`<QBlock, QQuantizer> of the headers.
std::string qBlockRole(const std::string &comment, const std::string &name, const std::string &role) {
  return functionHead(comment, name) + "  " + role + "<QBlock, QQuantizer>(params, cta, shared);\n}\n";
}

// The cast that stands in for psi_Q or psi_K when the operand is not quantized (granularity none).
std::string castNote(const PrologueConfig &config) {
  return config.input == schedules::InputType::bf16 ? "rounded to bf16" : "rounded to f16";
}

std::string castQBlock(const PrologueConfig &config) {
  std::string comment = "// Launch 1: Q is not quantized: x " + castNote(config) +
                        " (round to nearest even) into q_codes [b, h_q, padded_q, d], 2 bytes\n// per value, "
                        "padded rows 0";
  comment += config.smooth_q ? " (and q_mean).\n" : ".\n";
  return qBlockRole(comment, "quantizeQBlock", "castQBlockOf");
}

std::string quantizeQBlock(const PrologueConfig &config) {
  if (config.q.cast())
    return castQBlock(config);
  if (config.q.microscaled()) {
    std::string comment = "// Launch 1: psi_Q (FP4) on one Q block: e2m1 codes into q_codes [b, h_q, padded_q, d / 2] "
                          "and\n// microscales into q_scales [b, h_q, padded_q, d / " +
                          std::to_string(config.q.groupChannels()) + "] (padded rows 0)";
    comment += config.smooth_q ? "; also the block's q_mean.\n" : ".\n";
    return qBlockRole(comment, "quantizeQBlock", "quantizeFp4QBlockOf");
  }
  if (config.q.perTensor())
    return qBlockRole(
        "// Launch 2: psi_Q with a per-tensor scale, on the second read of a Q block: the amax is the max of "
        "launch 1's\n// block amax (every block computes the same); block 0 stores scale = amax / qmax.\n",
        "quantizeQBlock", "quantizePerTensorQBlockOf");
  if (config.rotation_seed) {
    std::string comment = "// Launch 1: psi_Q(x R_Q) on one Q block, x rotated by the randomized Hadamard transform: "
                          "q_codes\n// [b, h_q, padded_q, d] (padded rows 0) and the block's q_scales";
    comment += config.smooth_q ? " (and q_mean, unrotated).\n" : ".\n";
    return qBlockRole(comment, "quantizeQBlock", "quantizeRotatedQBlockOf");
  }
  std::string comment =
      "// Launch 1: psi_Q on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's "
      "q_scales";
  comment += config.smooth_q ? "\n// (and q_mean).\n" : ".\n";
  return qBlockRole(comment, "quantizeQBlock", "quantizeQBlockOf");
}

std::string measureQBlock(const PrologueConfig &config) {
  std::string comment =
      "// Launch 1, for the per-tensor psi_Q: the amax of one Q block's x, kept in prologue_statistics for "
      "launch 2\n// to combine";
  comment += config.smooth_q ? "; also the block's q_mean.\n" : ".\n";
  return functionHead(comment, "measureQBlock") + "  measureQBlockOf<QBlock>(params, cta, shared);\n}\n";
}

std::string quantizeKTile(const PrologueConfig &config, bool after_statistics) {
  std::string comment = "// Launch " + std::string(after_statistics ? "2" : "1") + ": ";
  if (config.k.cast()) {
    comment += "K is not quantized: ";
    comment += config.smooth_k ? "gamma(K) = K - mean(K)" : "K";
    comment += " on kKBlocksPerTile KV blocks, " + castNote(config) +
               " (round to nearest\n// even) into k_codes [b, h_kv, padded_kv, d], 2 bytes per value, padded rows 0.\n";
  } else {
    comment += config.smooth_k ? "phi_K = psi_K o gamma" : "psi_K";
    comment += " on kKBlocksPerTile KV blocks: k_codes [b, h_kv, padded_kv, d] (padded rows 0)";
    comment += config.k.perTensor()
                   ? ";\n// the per-tensor scale's amax is combined from launch 1's slices, and tile 0 stores the "
                     "scale.\n"
                   : " and the\n// blocks' k_scales.\n";
  }
  if (config.smooth_q)
    comment += "// Q is smoothed: the tile also writes its tokens' delta_s (q_mean . x_K) for every Q block.\n";
  const auto flag = [](bool value) { return value ? "true" : "false"; };
  std::string text = "struct KRole { // the variant's psi_K role (k_quantize.cuh)\n";
  text += "  using Tile = KTile;\n  using Quantizer = KQuantizer;\n";
  text += std::string("  static constexpr bool kStatistics = ") + flag(config.kStatistics()) +
          ", kSmoothed = " + flag(config.smooth_k) + ", kQMeanCorrection = " + flag(config.smooth_q) +
          ", kRotated = " + flag(config.rotation_seed.has_value()) + ", kCast = " + flag(config.k.cast()) +
          ", kMicroscaled = " + flag(config.k.microscaled()) + ", kPerTensor = " + flag(config.k.perTensor()) +
          ";\n};\n";
  return text + functionHead(comment, "quantizeKTile") + "  quantizeKTileOf<KRole>(params, cta, shared);\n}\n";
}

// V for an f16 P.V (sage/device/prologue/v_convert.cuh), smoothed or not.
std::string convertVTile(const PrologueConfig &config) {
  std::string comment = "// Launch " + std::string(config.smooth_v ? "2" : "1") + ": V for an f16 P.V: ";
  comment += config.smooth_v ? "V - mean(V) (V smoothing, one f32 subtraction), " : "";
  comment += "rounded to f16 into\n// v_values [b, h_kv, padded_kv, d] (padded rows 0).\n";
  return functionHead(comment, "convertVTile") + "  convertVTileOf<" + (config.smooth_v ? "SmoothedVMean" : "NoVMean") +
         ">(params, cta, shared);\n}\n";
}

// FP4 V: microscaled along its tokens (P.V's reduction axis) and transposed (sage/device/prologue/v_fp4_quantize.cuh).
std::string quantizeFp4VTile(const PrologueConfig &config) {
  const int group = config.vGroupTokens();
  const bool mx = group == 32;
  std::string comment = "// Launch 1: psi_V (" + std::string(mx ? "MXFP4" : "NVFP4") +
                        ") on one V tile, along the tokens: e2m1 codes of V^T into v_codes [b, h_kv, d, padded_kv / "
                        "2]\n// (token 2t in the low nibble of byte t) and one " +
                        (mx ? "ue8m0" : "ue4m3") + " scale per " + std::to_string(group) +
                        " tokens of a channel into v_scales [b, h_kv, d,\n// padded_kv / " + std::to_string(group) +
                        "]; padded tokens are 0.\n";
  return functionHead(comment, "quantizeVTile") + "  quantizeFp4VTileOf<" + std::to_string(group) +
         ">(params, cta, shared);\n}\n";
}

// Per-channel psi_V (sage/device/prologue/v_quantize.cuh), in the token order of the variant's v_codes.
std::string quantizeVTile(const PrologueConfig &config) {
  if (config.v_output == VOutput::fp4_codes)
    return quantizeFp4VTile(config);
  std::string comment = "// Launch 2: per-channel psi_V on one V tile";
  comment += config.smooth_v ? " of V - mean(V)" : "";
  comment += ": codes transposed to v_codes [b, h_kv, d, padded_kv]\n// for the mma B operand (padded tokens get "
             "code 0); tile 0 also stores v_scales";
  comment += config.smooth_v ? " and v_mean.\n" : ".\n";
  return functionHead(comment, "quantizeVTile") + "  quantizeVTileOf<" + (config.smooth_v ? "true" : "false") +
         ", VQuantizer, " + (config.interleavedVCodes() ? "WgmmaTokenOrder" : "NaturalTokenOrder") +
         ">(params, cta, shared);\n}\n";
}

} // namespace

std::string emitRoleFunction(PrologueRole role, const PrologueConfig &config) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return columnStatistics(config, true);
  case PrologueRole::v_column_statistics:
    return columnStatistics(config, false);
  case PrologueRole::q_block_statistics:
    return measureQBlock(config);
  case PrologueRole::q_block_quantize:
    return quantizeQBlock(config);
  case PrologueRole::k_block_quantize:
    return quantizeKTile(config, config.kAfterStatistics());
  case PrologueRole::v_tile_convert:
    return convertVTile(config);
  case PrologueRole::v_tile_quantize:
    return quantizeVTile(config);
  }
  throw std::logic_error("emitRoleFunction: unknown role");
}

std::string roleFunctionName(PrologueRole role, const PrologueConfig &) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return "reduceKColumns";
  case PrologueRole::v_column_statistics:
    return "reduceVColumns";
  case PrologueRole::q_block_statistics:
    return "measureQBlock";
  case PrologueRole::q_block_quantize:
    return "quantizeQBlock";
  case PrologueRole::k_block_quantize:
    return "quantizeKTile";
  case PrologueRole::v_tile_convert:
    return "convertVTile";
  case PrologueRole::v_tile_quantize:
    return "quantizeVTile";
  }
  throw std::logic_error("roleFunctionName: unknown role");
}

std::string roleCtaCountExpression(PrologueRole role) {
  switch (role) {
  case PrologueRole::k_column_statistics:
  case PrologueRole::v_column_statistics:
    return "kvHeads(params.size) * statisticsSlices(params.size)";
  case PrologueRole::q_block_statistics:
  case PrologueRole::q_block_quantize:
    return "qHeads(params.size) * (params.size.padded_q / kBlockQ)";
  case PrologueRole::k_block_quantize:
    return "kvHeads(params.size) * ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile)";
  case PrologueRole::v_tile_convert:
  case PrologueRole::v_tile_quantize:
    return "kvHeads(params.size) * vTiles(params.size)";
  }
  throw std::logic_error("roleCtaCountExpression: unknown role");
}

std::string roleSummary(PrologueRole role, const PrologueConfig &config) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return "K column statistics per slice (batch * heads_kv * slices CTAs)";
  case PrologueRole::v_column_statistics:
    return "V column statistics per slice (batch * heads_kv * slices CTAs)";
  case PrologueRole::q_block_statistics:
    return "per-tensor psi_Q: amax of each Q block (batch * heads_q * ceil(tokens_q / b_q) CTAs)";
  case PrologueRole::q_block_quantize:
    return std::string(config.q.cast() ? "Q cast to the input type" : "psi_Q") +
           " per Q block (batch * heads_q * ceil(tokens_q / b_q) CTAs)";
  case PrologueRole::k_block_quantize:
    return std::string(config.k.cast()
                           ? (config.smooth_k ? "gamma(K) cast to the input type" : "K cast to the input type")
                       : config.smooth_k ? "phi_K = psi_K o gamma"
                                         : "psi_K") +
           " per " + std::to_string(config.tunables.k_blocks_per_tile) +
           " KV block(s) (batch * heads_kv * ceil(tokens_kv / (" + std::to_string(config.tunables.k_blocks_per_tile) +
           " * b_kv)) CTAs)";
  case PrologueRole::v_tile_convert:
    return std::string(config.smooth_v ? "V - mean(V)" : "V") +
           " to f16 per V tile (batch * heads_kv * ceil(padded_kv / " + std::to_string(config.tunables.v_tile_tokens) +
           ") CTAs)";
  case PrologueRole::v_tile_quantize:
    return std::string(config.v_output == VOutput::fp4_codes ? "FP4 psi_V along the tokens" : "per-channel psi_V") +
           " per V tile (batch * heads_kv * ceil(padded_kv / " + std::to_string(config.tunables.v_tile_tokens) +
           ") CTAs)";
  }
  throw std::logic_error("roleSummary: unknown role");
}

} // namespace sage::codegen::prologue
