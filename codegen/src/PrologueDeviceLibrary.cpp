// The device library of the generated prologue kernels: constants, conversions, loads, reductions and the
// generic tile quantizer. Everything variant-specific is a constexpr or a small generated struct; the fixed device
// code lives in sage/device/prologue/*.cuh, pasted in the order its names need.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/PrologueDeviceCode.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sage::codegen::prologue {
namespace {

std::string constant(const char *name, long long value, const char *comment) {
  std::string line = "[[maybe_unused]] constexpr int " + std::string(name) + " = " + std::to_string(value) + ";";
  if (*comment)
    line += std::string(line.size() < 60 ? 60 - line.size() : 1, ' ') + "// " + comment;
  return line + "\n";
}

std::string inputName(schedules::InputType input) { return input == schedules::InputType::bf16 ? "bf16" : "f16"; }

// Shared bytes each role needs, as constexpr names defined in emitConstants.
std::string_view sharedBudgetOf(PrologueRole role) {
  switch (role) {
  case PrologueRole::k_column_statistics:
  case PrologueRole::v_column_statistics:
    return "kColumnStatisticsSharedBytes";
  case PrologueRole::q_block_statistics:
  case PrologueRole::q_block_quantize:
  case PrologueRole::k_block_quantize:
    return "kTileSharedBytes";
  case PrologueRole::v_tile_convert:
    return "kVConvertSharedBytes";
  case PrologueRole::v_tile_quantize:
    return "kVQuantizeSharedBytes";
  }
  return "kTileSharedBytes";
}

} // namespace

std::string pasteDeviceHeader(const std::string &name) {
  return "\n" + expandDeviceIncludes("#include \"" + name + "\"\n");
}

std::string emitConstants(const PrologueConfig &config) {
  const PrologueTunables &tunables = config.tunables;
  std::string text = "// ---- Shapes fixed at generation time, and tunables ----\n";
  text += constant("kThreads", tunables.threads, "threads per CTA (blockDim.x)");
  text += constant("kHeadDim", config.head_dim, "d");
  text += constant("kVectorElements", 8, ("one 16-byte load holds 8 " + inputName(config.input) + " values").c_str());
  text += "[[maybe_unused]] constexpr int kVectorsPerRow = kHeadDim / kVectorElements;\n";
  // A row's lanes are a power-of-two group of a warp, so that a row reduces with butterfly shuffles; where d / 8 is
  // not a power of two (d = 80, 96, 160, 192) the group's last lanes hold no vector (token_tile.cuh).
  int lanes_per_row = 1;
  while (lanes_per_row < config.head_dim / 8)
    lanes_per_row *= 2;
  text +=
      constant("kLanesPerRow", lanes_per_row, "lanes of one token row: kVectorsPerRow rounded up to a power of two");
  text += "[[maybe_unused]] constexpr int kRowsPerPass = kThreads / kLanesPerRow; // token rows a CTA covers, one "
          "vector a thread\n";
  text += constant("kBlockQ", config.block_q, "b_q: Q tokens per attention tile");
  text += constant("kBlockKv", config.block_kv, "b_kv: K/V tokens per attention tile");
  text += constant("kStatisticsCtasPerTensor", config.statistics_ctas_per_tensor,
                   "column-statistics CTAs per tensor to aim for");
  text += constant("kStatisticsMinSliceTokens", tunables.statistics_min_slice_tokens,
                   "tokens a column-statistics CTA reduces at least");
  text += constant("kMaxStatisticsSlices", tunables.max_statistics_slices, "slices per head at most");
  text += constant("kStatisticsUnroll", tunables.statistics_unroll, "loads in flight per thread in a column reduction");
  text += constant("kVTileTokens", tunables.v_tile_tokens, "tokens of one V tile");
  text += constant("kKBlocksPerTile", tunables.k_blocks_per_tile, "KV blocks one psi_K CTA quantizes");
  text += "[[maybe_unused]] constexpr int kKTileTokens = kBlockKv * kKBlocksPerTile;\n";
  text += "[[maybe_unused]] constexpr int kVTileWords = kVTileTokens / 4; // a transposed V row packs 4 tokens' codes "
          "per word\n";
  // Packed variable-length batches (sequences.cuh): each slot's rows and length from SagePrologueParams::sequences.
  text += std::string("[[maybe_unused]] constexpr bool kPackedSequences = ") +
          (config.packed_sequences ? "true" : "false") + "; // rows of slot b from cu_seqlens[b]\n";
  const bool one_pass = config.onePass();
  text += std::string("[[maybe_unused]] constexpr bool kOnePass = ") + (one_pass ? "true" : "false") +
          "; // statistics and the tiles that wait for them in one launch\n";
  text += std::string("[[maybe_unused]] constexpr bool kOnePassKStatistics = ") +
          (one_pass && config.kStatistics() ? "true" : "false") + ";\n";
  text += std::string("[[maybe_unused]] constexpr bool kOnePassVStatistics = ") +
          (one_pass && config.vStatistics() ? "true" : "false") + ";\n";
  // At most 768 threads' worth, so that the cap leaves >= 85 registers a thread (it was measured on 256-thread CTAs).
  text += constant("kMinCtasPerSm", std::max(1, std::min(tunables.min_ctas_per_sm, 768 / tunables.threads)),
                   "__launch_bounds__' minimum: registers are capped to fit that many CTAs on an SM");
  text += constant("kOnePassLookaheadHeads", tunables.one_pass_lookahead_heads,
                   "one pass: heads whose statistics run ahead of a head's tiles");
  return text;
}

std::string emitSharedBudgets(const std::vector<PrologueRole> &roles) {
  std::string text =
      "\n// ---- Shared memory of each role, in bytes ----\n"
      "// A token tile: [kRowsPerPass x kHeadDim partial sums | kHeadDim means | group amax | group inverse].\n"
      "// A V tile: [kHeadDim means | kHeadDim inverses | kHeadDim x kVTileWords words of codes].\n";
  text += "__host__ __device__ constexpr int maxOf(int a, int b) { return a > b ? a : b; }\n";
  text += "[[maybe_unused]] constexpr int kMaxGroupsPerTile = maxOf(QQuantizerGroups, KQuantizerGroups);\n";
  text += "[[maybe_unused]] constexpr int kTileMeansOffset = kRowsPerPass * kHeadDim * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileGroupAmaxOffset = kTileMeansOffset + kHeadDim * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileGroupInverseOffset = kTileGroupAmaxOffset + kMaxGroupsPerTile * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileSharedBytes = kTileGroupInverseOffset + kMaxGroupsPerTile * 4;\n";
  const auto uses = [&](const char *budget) {
    return std::any_of(roles.begin(), roles.end(), [&](PrologueRole role) { return sharedBudgetOf(role) == budget; });
  };
  if (uses("kColumnStatisticsSharedBytes"))
    text += "[[maybe_unused]] constexpr int kColumnStatisticsSharedBytes = kRowsPerPass * kHeadDim * 4;\n";
  if (uses("kVConvertSharedBytes"))
    text += "[[maybe_unused]] constexpr int kVConvertSharedBytes = kHeadDim * 4;\n";
  if (uses("kVQuantizeSharedBytes"))
    text += "[[maybe_unused]] constexpr int kVQuantizeSharedBytes = 2 * kHeadDim * 4 + kHeadDim * kVTileWords * 4;\n";
  std::vector<std::string> budgets;
  for (PrologueRole role : roles)
    if (std::find(budgets.begin(), budgets.end(), sharedBudgetOf(role)) == budgets.end())
      budgets.emplace_back(sharedBudgetOf(role));
  std::string largest = budgets.front();
  for (size_t i = 1; i < budgets.size(); ++i)
    largest = "maxOf(" + largest + ", " + budgets[i] + ")";
  text += "// The largest role of this launch:\n";
  text += "[[maybe_unused]] constexpr int kSharedBytes =\n    " + largest + ";\n";
  text += "static_assert(kThreads % 32 == 0 && kThreads >= kLanesPerRow && kLanesPerRow <= 32, \"whole warps, whole "
          "rows\");\n";
  return text;
}

std::string emitBasicHelpers(const PrologueConfig &config) {
  // The using-directive follows the first header: the generated code below names the headers' functions unqualified.
  return pasteDeviceHeader("sage/device/prologue/geometry.cuh") + "using namespace sage::device::prologue;\n" +
         pasteDeviceHeader("sage/device/prologue/scalar_helpers.cuh") +
         pasteDeviceHeader(config.input == schedules::InputType::bf16 ? "sage/device/prologue/input_bf16.cuh"
                                                                      : "sage/device/prologue/input_f16.cuh") +
         pasteDeviceHeader("sage/device/prologue/global_memory.cuh") +
         pasteDeviceHeader("sage/device/prologue/sequences.cuh");
}

namespace {

// The device library's FP4 microscaling (sage/device/fp4/microscaling.cuh, host-tested against sage::numerics),
// pasted in: the prologue is one self-contained translation unit.
std::string fp4Helpers() {
  const DeviceHeader *header = findDeviceHeader("sage/device/fp4/microscaling.cuh");
  if (header == nullptr)
    throw std::logic_error("prologue generator: the device library lacks sage/device/fp4/microscaling.cuh");
  std::string text(header->text);
  const size_t pragma = text.find("#pragma once\n");
  if (pragma != std::string::npos)
    text.erase(pragma, 13);
  return "\n// ---- FP4 microscaling (from the device library) ----\n" + text;
}

} // namespace

std::string emitCodeHelpers(const PrologueConfig &config) {
  std::string text = pasteDeviceHeader("sage/device/prologue/codes.cuh");
  if (config.usesFp4())
    text += fp4Helpers();
  if (config.usesE4m3())
    text += pasteDeviceHeader("sage/device/prologue/e4m3_codes.cuh");
  return text;
}

std::string emitTileLibrary() {
  return pasteDeviceHeader("sage/device/prologue/token_tile.cuh") +
         pasteDeviceHeader("sage/device/prologue/tile_reductions.cuh") +
         pasteDeviceHeader("sage/device/prologue/tile_quantizer.cuh");
}

std::string emitTokenQuantizer(const char *name, const TokenQuantizerConfig &quantizer, const char *tile_constant,
                               int blocks_per_tile, const char *what) {
  if (quantizer.microscaled()) {
    const bool mx = quantizer.groupChannels() == 32;
    std::string text = "\n// " + std::string(what) + ": " +
                       (mx ? "MXFP4: e2m1 codes, one ue8m0 scale per 32 channels of a token"
                           : "NVFP4: e2m1 codes, one ue4m3 scale per 16 channels of a token") +
                       "; codes [tokens, d / 2] (channel 2k in the\n// low nibble of byte k), scales [tokens, d / " +
                       std::to_string(quantizer.groupChannels()) + "], one byte each.\n";
    text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = 0;\n";
    text += "struct " + std::string(name) + " {\n";
    text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA quantizes\n";
    text += "  static constexpr int kGroupChannels = " + std::to_string(quantizer.groupChannels()) + ";\n";
    text += "  static __device__ __forceinline__ unsigned scaleCode(float amax) { return sage::device::fp4::" +
            std::string(mx ? "mxfp4_scale_code" : "nvfp4_scale_code") + "(amax); }\n";
    text += "  static __device__ __forceinline__ float inverse(unsigned scale) { return sage::device::fp4::" +
            std::string(mx ? "mxfp4_inverse" : "nvfp4_inverse") + "(scale); }\n";
    text += "};\n";
    (void)blocks_per_tile;
    return text;
  }
  if (quantizer.cast()) {
    std::string text = "\n// " + std::string(what) + ": none (the operand is not quantized): values rounded to " +
                       std::string(nameOf(quantizer.dtype)) + ", 2 bytes each, no scales.\n";
    text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = 0;\n";
    text += "struct " + std::string(name) + " {\n";
    text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA casts\n";
    text += "  static constexpr int kGroupsPerTile = 0;\n";
    text += "  static constexpr int kGroupsPerBlock = 0;\n";
    text += "};\n";
    return text;
  }
  const bool e4m3 = quantizer.dtype == ElementType::e4m3;
  const bool int4 = quantizer.dtype == ElementType::int4;
  std::string granularity;
  std::string group_of_row;
  switch (quantizer.granularity) {
  case Granularity::per_tensor:
    granularity = "per_tensor: one scale for the whole sequence of a head";
    group_of_row = "0";
    break;
  case Granularity::per_token:
    granularity = "per_token: one scale per token";
    group_of_row = "row";
    break;
  case Granularity::per_block:
  case Granularity::per_warp:
    granularity = std::string(quantizer.granularity == Granularity::per_block ? "per_block" : "per_warp") +
                  ": one scale per " + std::to_string(quantizer.group_tokens) + " consecutive tokens";
    group_of_row = "row / " + std::to_string(quantizer.group_tokens);
    break;
  default: // per_thread
    granularity = "per_thread: tokens t, t + 8, t + 16, ... of each " + std::to_string(quantizer.group_tokens) +
                  "-token group share a scale\n// (the rows of one mma thread group)";
    group_of_row = "row / " + std::to_string(quantizer.group_tokens) + " * 8 + row % 8";
    break;
  }
  std::string text = "\n// " + std::string(what) + ": " +
                     (e4m3   ? "e4m3"
                      : int4 ? "int4 (one per byte, [-7, 7])"
                             : "int8") +
                     " codes, " + granularity + ".\n";
  const int groups = quantizer.perTensor() ? 1 : quantizer.groups_per_tile * blocks_per_tile;
  text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = " + std::to_string(groups) + ";\n";
  text += "struct " + std::string(name) + " {\n";
  text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA quantizes\n";
  text += "  static constexpr int kGroupsPerTile = " + std::string(name) + "Groups; // scales of those tokens\n";
  text += "  static constexpr int kGroupsPerBlock = " +
          std::to_string(quantizer.perTensor() ? 1 : quantizer.groups_per_tile) + "; // scales per attention tile\n";
  text += std::string("  static constexpr float kCodeMax = ") + (e4m3 ? "448.0f" : int4 ? "7.0f" : "127.0f") + ";\n";
  text += "  static __device__ __forceinline__ int groupOfRow(int row) { return " + group_of_row + "; }\n";
  text += std::string("  static __device__ __forceinline__ uint2 pack(const float (&scaled)[8]) { return ") +
          (e4m3   ? "packE4m3Codes"
           : int4 ? "packInt4Codes"
                  : "packInt8Codes") +
          "(scaled); }\n";
  text += "};\n";
  return text;
}

std::string emitStatisticsScratch(const PrologueConfig &config, bool with_reduction) {
  // The fields of StatisticsScratch this variant has, in order (the layout the workspace is sized for).
  std::string text = pasteDeviceHeader("sage/device/prologue/statistics_scratch.cuh") + R"cuda(
__device__ __forceinline__ StatisticsScratch statisticsScratch(const SagePrologueParams &params) {
  const long long entries = kvHeads(params.size) * statisticsSlices(params.size) * kHeadDim;
  unsigned char *cursor = params.workspace + params.statistics_offset;
  StatisticsScratch scratch = {};
  (void)entries;
)cuda";
  if (config.q.perTensor()) {
    text += "  scratch.q_amax = (float *)cursor;\n";
    text += "  cursor += qHeads(params.size) * (params.size.padded_q / kBlockQ) * 4;\n";
  }
  const auto take = [&](const char *field, const char *type, int bytes) {
    text += "  scratch." + std::string(field) + " = (" + type + " *)cursor;\n";
    text += "  cursor += entries * " + std::to_string(bytes) + ";\n";
  };
  if (config.smooth_k)
    take("k_sum", "float", 4);
  if (config.smooth_v)
    take("v_sum", "float", 4);
  if (config.kMinMax()) {
    take("k_min", "unsigned short", 2);
    take("k_max", "unsigned short", 2);
  }
  if (config.vMinMax()) {
    take("v_min", "unsigned short", 2);
    take("v_max", "unsigned short", 2);
  }
  // Then the one-pass launch's combined statistics, one [batch * heads_kv][kHeadDim] f32 array each: they take no
  // more than the one slice's room the workspace holds beyond the slices.
  const auto take_combined = [&](const char *field) {
    text += "  scratch." + std::string(field) + " = (float *)cursor;\n";
    text += "  cursor += kvHeads(params.size) * kHeadDim * 4;\n";
  };
  if (config.smooth_k)
    take_combined("k_mean");
  if (config.kMinMax())
    take_combined("k_amax");
  if (config.smooth_v)
    take_combined("v_mean");
  if (config.vMinMax())
    take_combined("v_inverse");
  text += "  return scratch;\n}\n";
  text += pasteDeviceHeader("sage/device/prologue/one_pass.cuh"); // the combines wait there in the one-pass launch
  if (with_reduction)
    text += pasteDeviceHeader("sage/device/prologue/column_reduction.cuh");
  return text;
}

} // namespace sage::codegen::prologue
