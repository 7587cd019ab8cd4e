// What a variant asks of the quantization prologue, validated and reduced to the facts the code generator
// needs (internal to the prologue generator; PrologueGenerator.h is the public interface).
#pragma once

#include "sage/codegen/PrologueGenerator.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/InputType.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace sage::codegen {

// psi_Q or psi_K: symmetric codes with one f32 scale per group of tokens, or (granularity none) a cast: the
// values rounded to the input type, 2 bytes each, no scales.
struct TokenQuantizerConfig {
  ElementType dtype = ElementType::int8; // int8, int4 (one per byte) or e4m3 codes; f16 or bf16 for a cast
  Granularity granularity = Granularity::per_block;
  int tile_tokens = 0;     // b_q or b_kv: the attention tile whose groups these are
  int group_tokens = 0;    // per_block / per_warp / per_thread: tokens per group (resolved, divides the tile)
  int groups_per_tile = 0; // scales per attention tile (1 for per_tensor, whose scale covers the whole sequence)

  bool perTensor() const { return granularity == Granularity::per_tensor; }
  // FP4 (issue 11): e2m1 codes, two per byte, with one ue4m3 (NVFP4, 1x16) or ue8m0 (MXFP4, 1x32) scale byte per
  // group of channels of a token (the layout of codegen/README.md, "FP4 operands").
  bool microscaled() const { return isMicroscale(granularity); }
  int groupChannels() const { return microscaleGroupSize(granularity); }
  bool cast() const { return granularity == Granularity::none; }
  float codeMax() const { return dtype == ElementType::e4m3 ? 448.0f : dtype == ElementType::int4 ? 7.0f : 127.0f; }
};

// What the prologue writes for V.
enum class VOutput : uint8_t {
  none,       // f16 P.V on an f16, unsmoothed V: the attention kernel reads V in place
  f16_values, // f16 P.V on a bf16 or smoothed V: v_values
  codes,      // int8 or e4m3 P.V: per-channel scales and transposed codes
  fp4_codes,  // FP4 P.V: V^T e2m1 codes [d, padded_kv / 2] and microscales along the tokens [d, padded_kv / group]
};

struct PrologueConfig {
  std::string variant_name;
  schedules::InputType input = schedules::InputType::f16;
  int head_dim = 128;
  int block_q = 128;
  int block_kv = 64;
  TokenQuantizerConfig q, k;
  bool fold_q_scale = false; // x = Q * q_prescale before psi_Q
  bool smooth_q = false;     // Q minus its block mean (SageAttention2)
  bool smooth_k = false;     // gamma(K) = K - mean(K) over the sequence
  bool smooth_v = false;     // V minus its sequence mean
  // Q and K rotated by the randomized Hadamard transform with this seed after smoothing, before psi (issue 28;
  // sage/numerics/Hadamard.h): the Q role and the K role rotate the tokens they quantize, in registers.
  std::optional<uint32_t> rotation_seed = std::nullopt;
  VOutput v_output = VOutput::none;
  ElementType v_dtype = ElementType::f16;               // int8 or e4m3 when v_output == codes, e2m1 for fp4_codes
  Granularity v_granularity = Granularity::per_channel; // microscale_1x16 / 1x32 for fp4_codes
  schedules::VCodesTokenOrder v_codes_token_order = schedules::VCodesTokenOrder::natural; // codes only
  // Variable-length batches (variant.packed_sequences): slot b's rows are cu_seqlens[b] + t of the packed tensors
  // and its lengths replace tokens_q / tokens_kv (sage/device/prologue/sequences.cuh). Never one pass.
  bool packed_sequences = false;
  PrologueTunables tunables;            // resolved: no zero (derived) fields left
  int statistics_ctas_per_tensor = 256; // tunables.statistics_target_ctas shared by K's and V's statistics

  // Column statistics that must be reduced over the whole sequence before the tensor can be quantized.
  bool kStatistics() const { return smooth_k || k.perTensor(); }
  // K is quantized in launch 2 when it needs statistics, or when Q is smoothed: its tiles then also write
  // delta_s = q_mean . gamma(K), which needs launch 1's q_mean.
  bool kAfterStatistics() const { return kStatistics() || smooth_q; }
  bool kMinMax() const { return k.perTensor(); }
  bool vStatistics() const { return smooth_v || v_output == VOutput::codes; }
  int vGroupTokens() const { return v_output == VOutput::fp4_codes ? microscaleGroupSize(v_granularity) : 0; }
  bool usesFp4() const { return q.microscaled() || k.microscaled() || v_output == VOutput::fp4_codes; }
  bool vMinMax() const { return v_output == VOutput::codes; }
  // One launch with the statistics on chip (PrologueGenerator.h): whenever K's or V's tiles need the column
  // statistics of the whole sequence and nothing else from another role (a per-tensor psi_Q's amax or Q
  // smoothing's q_mean need the second launch).
  bool onePass() const { return tunables.one_pass && (kStatistics() || vStatistics()) && !q.perTensor() && !smooth_q; }
  // Whether launch 1 leaves anything in the workspace's prologue_statistics for launch 2.
  bool usesStatisticsScratch() const { return kStatistics() || vStatistics() || q.perTensor(); }
  float vCodeMax() const { return v_dtype == ElementType::e4m3 ? 448.0f : 127.0f; }
  bool interleavedVCodes() const {
    return v_output == VOutput::codes && v_codes_token_order == schedules::VCodesTokenOrder::wgmma_interleaved_32;
  }
  bool usesE4m3() const {
    return q.dtype == ElementType::e4m3 || k.dtype == ElementType::e4m3 ||
           (v_output == VOutput::codes && v_dtype == ElementType::e4m3);
  }
  PrologueGeometry geometry() const;
};

// Throws std::invalid_argument naming the offending field when the prologue cannot serve the variant.
PrologueConfig makePrologueConfig(const AttentionVariant &variant, schedules::InputType input, int head_dim,
                                  const PrologueTunables &tunables, const PrologueOptions &options = {});

// One launch of the plan: its entry point, what it does, and its roles in blockIdx.x order.
struct PlannedLaunch {
  std::string entry_point;
  std::string name;
  std::vector<PrologueRole> roles;
  bool one_pass = false; // the roles run in ticket order (PrologueConfig::onePass)
};

// The launches, in order (see PrologueGenerator.h for why there are two).
std::vector<PlannedLaunch> planPrologueLaunches(const PrologueConfig &config);

} // namespace sage::codegen
