// Validation of a variant for the quantization prologue, and the launch plan.
#include "sage/codegen/PrologueConfig.h"
#include "sage/schedules/PrologueHeadDim.h"
#include "sage/schedules/PrologueRotation.h"

#include "sage/ir/AttentionVariant.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::codegen {
namespace {

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

std::string dtypeName(ElementType type) { return std::string(nameOf(type)); }

std::string granularityName(Granularity granularity) { return std::string(nameOf(granularity)); }

std::string scopeName(SmoothScope scope) { return std::string(nameOf(scope)); }

bool isPowerOfTwo(int value) { return value > 0 && (value & (value - 1)) == 0; }

int nextPowerOfTwo(int value) {
  int power = 1;
  while (power < value)
    power *= 2;
  return power;
}

TokenQuantizerConfig tokenQuantizer(const QuantizerSpec &spec, int tile_tokens, schedules::InputType input,
                                    const std::string &field) {
  TokenQuantizerConfig config;
  config.granularity = spec.granularity;
  config.tile_tokens = tile_tokens;
  if (spec.granularity == Granularity::none) {
    // Unquantized: the attention kernel multiplies Q and K in the input type (f32 is rounded to it on the GPU).
    require(spec.dtype == ElementType::f16 || spec.dtype == ElementType::bf16 || spec.dtype == ElementType::f32,
            field + ".dtype: an unquantized (granularity none) operand is a cast of f16, bf16 or f32, got " +
                dtypeName(spec.dtype));
    require(spec.static_scale <= 0.0 && !spec.two_level,
            field + ": an unquantized (granularity none) operand has no static or two-level scale");
    config.dtype = input == schedules::InputType::bf16 ? ElementType::bf16 : ElementType::f16;
    return config;
  }
  if (isMicroscale(spec.granularity)) { // FP4: NVFP4 (1x16, ue4m3) or MXFP4 (1x32, ue8m0) along the channels
    const ScaleType expected = spec.granularity == Granularity::microscale_1x16 ? ScaleType::ue4m3 : ScaleType::ue8m0;
    require(spec.dtype == ElementType::e2m1,
            field + ".dtype: microscaled codes are e2m1 (FP4), got " + dtypeName(spec.dtype));
    require(spec.scale_type == expected && !spec.two_level && spec.static_scale <= 0.0,
            field + ": " + granularityName(spec.granularity) + " takes " + std::string(nameOf(expected)) +
                " scales, with no two-level or static scale");
    config.dtype = spec.dtype;
    return config;
  }
  require(spec.dtype == ElementType::int8 || spec.dtype == ElementType::int4 || spec.dtype == ElementType::e4m3,
          field + ".dtype: the prologue writes int8, int4 (one per byte) or e4m3 codes, got " + dtypeName(spec.dtype));
  require(spec.scale_type == ScaleType::f32 && !spec.two_level && spec.static_scale <= 0.0,
          field + ": the prologue computes one dynamic f32 scale per group (no ue4m3, two-level or static scales)");
  config.dtype = spec.dtype;
  switch (spec.granularity) {
  case Granularity::per_tensor:
    config.groups_per_tile = 1;
    break;
  case Granularity::per_token:
    config.groups_per_tile = tile_tokens;
    break;
  case Granularity::per_block:
  case Granularity::per_warp:
  case Granularity::per_thread: {
    config.group_tokens = spec.group_tokens > 0 ? spec.group_tokens : tile_tokens;
    require(tile_tokens % config.group_tokens == 0, field + ".group_tokens " + std::to_string(config.group_tokens) +
                                                        " must divide the " + std::to_string(tile_tokens) +
                                                        "-token tile");
    const bool interleaved = spec.granularity == Granularity::per_thread;
    require(!interleaved || config.group_tokens % 8 == 0,
            field + ".group_tokens: per_thread interleaves tokens by 8, so it must be a multiple of 8, got " +
                std::to_string(config.group_tokens));
    config.groups_per_tile = tile_tokens / config.group_tokens * (interleaved ? 8 : 1);
    break;
  }
  default:
    throw std::invalid_argument(field +
                                ".granularity: expected none (a cast), per_tensor, per_token, per_block, "
                                "per_warp or per_thread, got " +
                                granularityName(spec.granularity));
  }
  return config;
}

void validateTunables(const PrologueTunables &tunables, int head_dim) {
  require(tunables.threads == 0 ||
              (isPowerOfTwo(tunables.threads) && tunables.threads >= 64 && tunables.threads <= 1024),
          "tunables.threads: expected 0 (derived) or a power of two from 64 to 1024, got " +
              std::to_string(tunables.threads));
  require(tunables.statistics_target_ctas >= 1,
          "tunables.statistics_target_ctas: expected >= 1, got " + std::to_string(tunables.statistics_target_ctas));
  require(tunables.statistics_min_slice_tokens >= 16,
          "tunables.statistics_min_slice_tokens: expected at least 16 (prologue_statistics is sized for that), got " +
              std::to_string(tunables.statistics_min_slice_tokens));
  require(tunables.max_statistics_slices >= 1 &&
              tunables.max_statistics_slices <= schedules::kMaxPrologueStatisticsSlices,
          "tunables.max_statistics_slices: expected 1 to " + std::to_string(schedules::kMaxPrologueStatisticsSlices) +
              " (the workspace's prologue_statistics is sized for that many), got " +
              std::to_string(tunables.max_statistics_slices));
  require(tunables.statistics_unroll >= 1 && tunables.statistics_unroll <= 16,
          "tunables.statistics_unroll: expected 1 to 16, got " + std::to_string(tunables.statistics_unroll));
  const int v_tile = tunables.v_tile_tokens;
  require(v_tile == 0 || v_tile == 128 || v_tile == 256 || v_tile == 512,
          "tunables.v_tile_tokens: expected 0 (derived), 128, 256 or 512, got " + std::to_string(v_tile));
  require(head_dim * v_tile <= 32768, "tunables.v_tile_tokens: a transposed " + std::to_string(v_tile) + " x " +
                                          std::to_string(head_dim) + " V tile exceeds 32 KiB of shared memory");
  require(tunables.k_blocks_per_tile >= 0 && tunables.k_blocks_per_tile <= 16,
          "tunables.k_blocks_per_tile: expected 0 (derived) to 16, got " + std::to_string(tunables.k_blocks_per_tile));
  require(tunables.min_ctas_per_sm >= 0 && tunables.min_ctas_per_sm <= 8,
          "tunables.min_ctas_per_sm: expected 0 to 8, got " + std::to_string(tunables.min_ctas_per_sm));
  require(tunables.one_pass_lookahead_heads >= 0 && tunables.one_pass_lookahead_heads <= 8,
          "tunables.one_pass_lookahead_heads: expected 0 to 8, got " +
              std::to_string(tunables.one_pass_lookahead_heads));
}

} // namespace

std::string_view nameOf(PrologueRole role) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return "k_column_statistics";
  case PrologueRole::v_column_statistics:
    return "v_column_statistics";
  case PrologueRole::q_block_statistics:
    return "q_block_statistics";
  case PrologueRole::q_block_quantize:
    return "q_block_quantize";
  case PrologueRole::k_block_quantize:
    return "k_block_quantize";
  case PrologueRole::v_tile_convert:
    return "v_tile_convert";
  case PrologueRole::v_tile_quantize:
    return "v_tile_quantize";
  }
  return "unknown";
}

PrologueGeometry PrologueConfig::geometry() const {
  PrologueGeometry geometry;
  geometry.head_dim = head_dim;
  geometry.block_q = block_q;
  geometry.block_kv = block_kv;
  geometry.threads = tunables.threads;
  geometry.statistics_ctas_per_tensor = statistics_ctas_per_tensor;
  geometry.statistics_min_slice_tokens = tunables.statistics_min_slice_tokens;
  geometry.max_statistics_slices = tunables.max_statistics_slices;
  geometry.v_tile_tokens = tunables.v_tile_tokens;
  geometry.k_blocks_per_tile = tunables.k_blocks_per_tile;
  return geometry;
}

PrologueConfig makePrologueConfig(const AttentionVariant &variant, schedules::InputType input, int head_dim,
                                  const PrologueTunables &tunables, const PrologueOptions &options) {
  require(head_dim == variant.head_dim, "head_dim: " + std::to_string(head_dim) +
                                            " does not match the variant's head_dim " +
                                            std::to_string(variant.head_dim));
  const schedules::SupportResult head_dims = schedules::prologueHeadDimSupport(head_dim);
  require(head_dims.supported, "head_dim: " + head_dims.reason);
  require(variant.block_q > 0 && variant.block_q % 16 == 0,
          "variant.block_q: expected a positive multiple of 16, got " + std::to_string(variant.block_q));
  require(variant.block_kv > 0 && variant.block_kv % 16 == 0,
          "variant.block_kv: expected a positive multiple of 16, got " + std::to_string(variant.block_kv));
  validateTunables(tunables, head_dim);

  PrologueConfig config;
  config.variant_name = variant.name;
  config.input = input;
  config.head_dim = head_dim;
  config.block_q = variant.block_q;
  config.block_kv = variant.block_kv;
  config.q = tokenQuantizer(variant.q, variant.block_q, input, "q");
  config.k = tokenQuantizer(variant.k, variant.block_kv, input, "k");
  require(!variant.k.fold_softmax_scale, "k.fold_softmax_scale: only Q folds the softmax scale");
  config.fold_q_scale = variant.q.fold_softmax_scale;

  require(variant.smooth_q == SmoothScope::none || variant.smooth_q == SmoothScope::block,
          "smooth_q: expected none or block, got " + scopeName(variant.smooth_q));
  require(variant.smooth_k == SmoothScope::none || variant.smooth_k == SmoothScope::sequence,
          "smooth_k: expected none or sequence, got " + scopeName(variant.smooth_k));
  require(variant.smooth_v == SmoothScope::none || variant.smooth_v == SmoothScope::sequence,
          "smooth_v: expected none or sequence, got " + scopeName(variant.smooth_v));
  config.smooth_q = variant.smooth_q == SmoothScope::block;
  config.smooth_k = variant.smooth_k == SmoothScope::sequence;
  config.smooth_v = variant.smooth_v == SmoothScope::sequence;
  if (variant.q.rotation_seed || variant.k.rotation_seed) {
    const schedules::SupportResult rotation = schedules::prologueRotationSupport(variant);
    require(rotation.supported, "rotation_seed: " + rotation.reason);
    config.rotation_seed = variant.q.rotation_seed;
  }

  const QuantizerSpec &v = variant.v;
  if (v.granularity == Granularity::none && v.static_scale <= 0.0) {
    // f32 too: the GPU has no f32 mma, so an f32 V (the exact preset) runs through the f16 P.V.
    require(v.dtype == ElementType::f16 || v.dtype == ElementType::f32,
            "v.dtype: an unquantized V must be f16 or f32 for the prologue (P.V in f16), got " + dtypeName(v.dtype));
    const bool convert = input == schedules::InputType::bf16 || config.smooth_v;
    config.v_output = convert ? VOutput::f16_values : VOutput::none;
  } else if (isMicroscale(v.granularity)) {
    // FP4 V: microscaled along its tokens (P.V's reduction axis), transposed.
    const ScaleType expected = v.granularity == Granularity::microscale_1x16 ? ScaleType::ue4m3 : ScaleType::ue8m0;
    require(v.dtype == ElementType::e2m1, "v.dtype: microscaled V codes are e2m1 (FP4), got " + dtypeName(v.dtype));
    require(v.scale_type == expected && !v.two_level && v.static_scale <= 0.0,
            "v: " + granularityName(v.granularity) + " takes " + std::string(nameOf(expected)) +
                " scales, with no two-level or static scale");
    require(!config.smooth_v, "smooth_v: FP4 V is not smoothed by the prologue");
    const int group = microscaleGroupSize(v.granularity);
    require(variant.block_kv % group == 0, "variant.block_kv: FP4 V groups " + std::to_string(group) +
                                               " tokens (padded_kv must hold whole groups), got " +
                                               std::to_string(variant.block_kv));
    config.v_output = VOutput::fp4_codes;
    config.v_dtype = v.dtype;
    config.v_granularity = v.granularity;
  } else {
    require(v.granularity == Granularity::per_channel,
            "v.granularity: expected per_channel, microscale_1x16/1x32 (FP4) or none (f16), got " +
                granularityName(v.granularity));
    require(v.dtype == ElementType::int8 || v.dtype == ElementType::e4m3,
            "v.dtype: per-channel V codes must be int8 or e4m3, got " + dtypeName(v.dtype));
    require(v.scale_type == ScaleType::f32 && !v.two_level && v.static_scale <= 0.0,
            "v: the prologue computes one dynamic f32 scale per channel");
    config.v_output = VOutput::codes;
    config.v_dtype = v.dtype;
    config.v_codes_token_order = options.v_codes_token_order;
    require(!config.interleavedVCodes() || variant.block_kv % 32 == 0,
            "options.v_codes_token_order: wgmma_interleaved_32 permutes groups of 32 tokens, so variant.block_kv "
            "must be a multiple of 32, got " +
                std::to_string(variant.block_kv));
  }

  // A packed batch's statistics are per sequence; the one-pass launch's ticket order and its combined statistics are
  // not written for that (the schedules refuse the tunable too).
  config.packed_sequences = variant.packed_sequences;
  require(!config.packed_sequences || !tunables.one_pass,
          "tunables.one_pass: the one-pass prologue does not take packed (variable-length) sequences; use the two "
          "launches (one_pass = false)");
  config.tunables = tunables;
  PrologueTunables &resolved = config.tunables;
  if (resolved.v_tile_tokens == 0) { // about 32 KiB of V per CTA, a power of two of at least 128 tokens (the
                                     // transpose's swizzle permutes aligned groups of 32 words: d = 80 gets 128)
    resolved.v_tile_tokens = 128;
    while (resolved.v_tile_tokens * 2 <= 16384 / head_dim)
      resolved.v_tile_tokens *= 2;
  }
  if (resolved.k_blocks_per_tile == 0) // about 32 KiB of K per CTA
    resolved.k_blocks_per_tile = std::clamp(16384 / (variant.block_kv * head_dim), 1, 4);
  // Launch 1's statistics CTAs are shared by the tensors that need them. Fewer slices per tensor also make the
  // combine in every K and V tile of launch 2 cheaper.
  const int statistics_tensors = (config.kStatistics() ? 1 : 0) + (config.vStatistics() ? 1 : 0);
  config.statistics_ctas_per_tensor = std::max(1, resolved.statistics_target_ctas / std::max(1, statistics_tensors));
  if (resolved.threads == 0) {
    // About 8 vectors (64 values) of the largest tile per thread: enough loads in flight, few registers. A row takes
    // d / 8 lanes rounded up to a power of two (token_tile.cuh): d = 80 counts 16 (sage-b d80's K tiles spilled 48
    // bytes with 256 threads, 12 vectors a thread).
    const int tile_tokens =
        std::max({variant.block_q, variant.block_kv * resolved.k_blocks_per_tile, resolved.v_tile_tokens});
    resolved.threads = std::clamp(nextPowerOfTwo(tile_tokens * nextPowerOfTwo(head_dim / 8) / 8), 256, 1024);
  }
  return config;
}

std::vector<PlannedLaunch> planPrologueLaunches(const PrologueConfig &config) {
  using Role = PrologueRole;
  const bool k_statistics = config.kStatistics();
  const bool v_statistics = config.vStatistics();
  const bool q_per_tensor = config.q.perTensor();

  if (config.onePass()) {
    // Along the tickets: the KV heads' statistics and the tiles that wait for them, head by head; then the roles
    // that wait for nothing (sage/device/prologue/one_pass.cuh).
    std::vector<Role> roles;
    if (k_statistics)
      roles.push_back(Role::k_column_statistics);
    if (v_statistics)
      roles.push_back(Role::v_column_statistics);
    if (k_statistics)
      roles.push_back(Role::k_block_quantize);
    if (v_statistics)
      roles.push_back(config.v_output == VOutput::codes ? Role::v_tile_quantize : Role::v_tile_convert);
    roles.push_back(Role::q_block_quantize);
    if (!k_statistics)
      roles.push_back(Role::k_block_quantize);
    if (!v_statistics && (config.v_output == VOutput::f16_values || config.v_output == VOutput::fp4_codes))
      roles.push_back(config.v_output == VOutput::fp4_codes ? Role::v_tile_quantize : Role::v_tile_convert);
    return {{"sage_prologue_one_pass", "one read of Q, K and V: statistics on chip, tiles after their head's",
             std::move(roles), true}};
  }

  std::vector<Role> first, second_read;
  // Long column reductions first, so that they start early and the tile roles fill the machine around them.
  if (k_statistics)
    first.push_back(Role::k_column_statistics);
  if (v_statistics)
    first.push_back(Role::v_column_statistics);
  first.push_back(q_per_tensor ? Role::q_block_statistics : Role::q_block_quantize);
  if (config.v_output == VOutput::f16_values && !config.smooth_v)
    first.push_back(Role::v_tile_convert);
  if (config.v_output == VOutput::fp4_codes) // microscales are local to 16 or 32 tokens: no statistics to wait for
    first.push_back(Role::v_tile_quantize);
  if (!config.kAfterStatistics())
    first.push_back(Role::k_block_quantize);

  if (config.kAfterStatistics())
    second_read.push_back(Role::k_block_quantize);
  if (v_statistics)
    second_read.push_back(config.v_output == VOutput::codes ? Role::v_tile_quantize : Role::v_tile_convert);
  if (q_per_tensor)
    second_read.push_back(Role::q_block_quantize);

  std::vector<PlannedLaunch> launches;
  launches.push_back({"sage_prologue_read_inputs", "first read of Q, K and V", std::move(first), false});
  if (!second_read.empty())
    launches.push_back({"sage_prologue_quantize_after_statistics",
                        "second read: quantize with the statistics of the whole sequence", std::move(second_read),
                        false});
  return launches;
}

} // namespace sage::codegen
