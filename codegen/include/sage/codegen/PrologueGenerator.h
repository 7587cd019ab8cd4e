// The quantization prologue's kernel generator: from a variant, the CUDA sources of the few launches that read
// Q, K and V and fill the workspace described by sage/schedules/WorkspaceLayout.h.
//
//   PrologueSource prologue = PrologueGenerator::generate(variant, InputType::bf16, 128);  // (, tunables, options)
//   for (size_t i = 0; i < prologue.kernels.size(); ++i)      // launch in order, on one stream,
//     launch(prologue.kernels[i], prologueGrid(prologue, i, shape), params);  // all with the same params
//
// Every kernel takes one SagePrologueParams by value (KernelAbi.h) and uses blockDim = (block_threads, 1, 1);
// gridDim.x comes from prologueGrid (PrologueLaunch.h), which adds up the CTA counts of the kernel's roles.
//
// mean(K), mean(V), V's per-channel amax and a per-tensor amax must be known over the whole sequence before the
// tensor is quantized. Two plans (planPrologueLaunches, PrologueConfig.h, decides):
// - Two launches (the default):
//   1. sage_prologue_read_inputs: column statistics of K and V per slice of tokens (sums, min/max) into the
//      workspace's prologue_statistics scratch, while psi_Q (or a per-tensor Q's block amax), an unsmoothed
//      f16 copy of V and a K that needs no statistics are done in the same pass.
//   2. sage_prologue_quantize_after_statistics: the second read of K and V (and of a per-tensor Q).
// - One pass (opt-in, tunables.one_pass; PrologueConfig::onePass says which variants can): one launch,
//   sage_prologue_one_pass. Each CTA draws a ticket from the workspace's prologue_counters; tickets order the work
//   head by head: the column statistics of a KV head's slices, then (one_pass_lookahead_heads later) its K and V
//   tiles, which wait until that head's statistics have published and read K and V again, from L2 if it still
//   holds them; psi_Q's blocks are spread between. A tile only waits for CTAs with earlier tickets, which never
//   wait themselves: no deadlock, whatever the residency. The counters must be zero at the launch
//   (prologueCounterBytes: the runtime clears them on the stream first). Measured on an H200 (2026-11-29) it is
//   slower than the two launches (sage2-fp8 d128, 16k tokens: 177 against 137 us): a short lookahead leaves tiles
//   waiting, a long one lets L2 drop what the statistics read. It stays as the base for a one-pass prologue that
//   keeps the tiles on chip while their head's statistics complete.
// In both, every tile combines its head's slices itself, in slice order (a few KiB from L2, overlapped with its
// own loads), so every CTA holds the same bits and both plans write the same bytes; the head's first tile stores
// k_mean, v_mean, v_scales and the per-tensor scale. Variants with nothing to reduce over the sequence get the
// first launch only.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sage::codegen {

// Tunables of the prologue: performance only, never the results (the sum order of the means aside). Zero
// means "derived". The defaults come from H100 measurements at 16k tokens x hidden 2048.
struct PrologueTunables {
  int threads = 0;                       // threads per CTA (power of two, 64..1024); 0: derived from the tiles
  int statistics_target_ctas = 256;      // column-statistics CTAs of launch 1 to aim for, K's and V's together
  int statistics_min_slice_tokens = 512; // tokens a column-statistics CTA reduces at least (>= 16)
  int max_statistics_slices = 32;        // slices per head at most (<= 64): every K and V tile re-reads a head's slices
  int statistics_unroll = 8;             // independent 16-byte loads in flight per thread while reducing columns
  int v_tile_tokens = 0;                 // tokens of one V tile (128, 256 or 512); 0: max(128, 16384 / head_dim)
  int k_blocks_per_tile = 0;             // KV blocks one psi_K CTA quantizes; 0: about 32 KiB of K per CTA
  bool one_pass = false;                 // opt-in: one launch, tiles after their head's statistics (onePass)
  int one_pass_lookahead_heads = 1;      // one pass: heads whose statistics run ahead of a head's tiles (0..8)
  int min_ctas_per_sm = 3;               // __launch_bounds__' minimum CTAs per SM (0..8, at most 768 / threads)
  bool operator==(const PrologueTunables &) const = default;
};

// What the attention kernel needs of the workspace beyond the variant: part of the contract with it (unlike the
// tunables, these change what is written).
struct PrologueOptions {
  // v_codes' token axis (WorkspaceLayout.h); no effect on variants without v_codes. wgmma_interleaved_32 needs
  // block_kv to be a multiple of 32.
  schedules::VCodesTokenOrder v_codes_token_order = schedules::VCodesTokenOrder::natural;
  bool operator==(const PrologueOptions &) const = default;
};

// What one range of a launch's CTAs does. A kernel's CTAs are its roles' ranges, in order, along blockIdx.x.
enum class PrologueRole : uint8_t {
  k_column_statistics, // per (batch, kv head, slice): per-channel sum (mean(K)) and/or min/max (per-tensor psi_K)
  v_column_statistics, // per (batch, kv head, slice): per-channel sum (mean(V)) and/or min/max (per-channel psi_V)
  q_block_statistics,  // per (batch, q head, Q block): Q block amax for a per-tensor psi_Q (and q_mean)
  q_block_quantize,    // per (batch, q head, Q block): psi_Q -> q_codes, q_scales (+ q_mean); unquantized: a cast
  k_block_quantize,    // per (batch, kv head, k_blocks_per_tile KV blocks): phi_K = psi_K o gamma -> k_codes, k_scales
                       // (unquantized K: gamma(K) or K rounded to the input type -> k_codes, 2 bytes per value)
  v_tile_convert,      // per (batch, kv head, V tile): V (- mean(V)) rounded to f16 -> v_values
  v_tile_quantize,     // per (batch, kv head, V tile): per-channel psi_V, transposed -> v_codes (+ v_scales, v_mean)
};

std::string_view nameOf(PrologueRole role);

// Everything the grid computation needs besides the problem shape.
struct PrologueGeometry {
  int head_dim = 128;
  int block_q = 128;
  int block_kv = 64;
  int threads = 256;
  int statistics_ctas_per_tensor = 256; // resolved from statistics_target_ctas
  int statistics_min_slice_tokens = 512;
  int max_statistics_slices = 32;
  int v_tile_tokens = 128;
  int k_blocks_per_tile = 1;
};

struct PrologueKernel {
  std::string name;                // what the launch does, for logs and `sagegen explain`
  std::string entry_point;         // the extern "C" __global__ function
  std::string source;              // one self-contained CUDA C++ translation unit (no includes) for NVRTC
  int block_threads = 256;         // blockDim = (block_threads, 1, 1)
  int dynamic_shared_bytes = 0;    // all shared memory is static
  std::vector<PrologueRole> roles; // CTA ranges along blockIdx.x, in this order (one pass: along the tickets)
  bool one_pass = false;           // draws tickets from prologue_counters, which must be zero at the launch
  std::string grid_rule;           // gridDim.x in words (prologueGrid computes it)
};

struct PrologueSource {
  std::string variant_name;
  schedules::InputType input = schedules::InputType::f16;
  PrologueOptions options;
  PrologueGeometry geometry;
  std::vector<PrologueKernel> kernels; // launch in this order on one stream, all with the same SagePrologueParams
};

class PrologueGenerator {
public:
  // Throws std::invalid_argument naming the field when the variant asks for something the prologue does not
  // produce (int4/FP4 codes, microscales, a V that is neither f16/f32 nor per-channel int8/e4m3, ...). An
  // unquantized Q or K (granularity none, f16/bf16/f32) is cast to `input`. A packed variant
  // (variant.packed_sequences) reads each slot's rows and lengths from SagePrologueParams::sequences, with the grids
  // and the workspace of a dense call of the maximum lengths; it refuses tunables.one_pass.
  static PrologueSource generate(const AttentionVariant &variant, schedules::InputType input, int head_dim,
                                 const PrologueTunables &tunables = {}, const PrologueOptions &options = {});
};

} // namespace sage::codegen
