// What a schedule decides for one (variant, arch, input type): everything codegen needs to write the kernel,
// and nothing about how the text looks. A plan is plain data; a Schedule's plan() builds it.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/Tunables.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <array>
#include <cstdint>
#include <string>

namespace sage::schedules {

// One warp-level mma.sync instruction: D[m x n] = A[m x k] * B[k x n] + C, A row-major, B column-major.
struct MmaShape {
  int m = 16, n = 8, k = 16;
  ElementType a = ElementType::f16;
  ElementType b = ElementType::f16;
  AccumulatorType accumulator = AccumulatorType::f32;
  bool operator==(const MmaShape &) const = default;
};

// How O += P.V is computed (the four families of the SageAttention kernels).
enum class PvPath : uint8_t {
  f16_accumulate_f16,  // f16 P x f16 V into an f16 accumulator (SageAttn-T/B), optionally flushed into f32
  f16_accumulate_f32,  // f16 P x f16 V into an f32 accumulator (the exact preset on the GPU)
  int8_per_block,      // int8 P (static scale) x int8 V^T (per channel) -> s32 per KV block, added into f32
  e4m3_accumulate_f32, // e4m3 P (static scale) x e4m3 V^T (per channel) into f32, optionally two-level
  e2m1_block_scaled,   // FP4 P (microscaled in registers, optionally two-level) x FP4 V^T, block-scaled mma, f32
  e2m1_decoded         // FP4 emulation (sm80): P microscaled in registers and V^T's codes, both decoded exactly to
               // pv_mma.a (f16 or bf16), m16n8k16 with f32 accumulation per KV block (times s_P1 when two-level)
};

// Where the attention kernel reads V from.
enum class ValueSource : uint8_t {
  input,            // the caller's f16 V in place (params.v with params.v_strides)
  workspace_values, // f16 copy written by the prologue (converted from bf16 and/or smoothed): offsets.v_values
  workspace_codes,  // int8/e4m3 codes, transposed [d, padded_kv]: offsets.v_codes
};

// Which scale group a token of Q or K uses, mirroring scaleGroupOfToken: group(t) = (t / tokens_per_group) *
// interleave + t % interleave. per_tensor has tokens_per_group 0 (a single group).
struct ScaleIndexing {
  bool used = false;            // false: Q/K are not quantized (no scales)
  int64_t tokens_per_group = 0; // 1 for per_token, group_tokens for per_block/per_warp/per_thread
  int interleave = 1;           // 8 for per_thread (tokens t, t+8, ... of a tile share a scale)
  int64_t groupOf(int64_t token) const;
  bool operator==(const ScaleIndexing &) const = default;
};

// How `spec`'s scales are indexed; `block_tokens` is the variant's tile, which a group_tokens of 0 stands for.
// Shared by the schedules (the prologue writes the scales the same way for all of them).
ScaleIndexing scaleIndexingOf(const QuantizerSpec &spec, int block_tokens);

// One shared-memory buffer: `rows` rows of `row_bytes` bytes, XOR-swizzled in 16-byte chunks.
struct SharedRegion {
  int offset = 0; // bytes from the start of its owner (the CTA's buffer for q, the stage for k/v/k_scales)
  int bytes = 0;
  int rows = 0;
  int row_bytes = 0;
};

struct SharedMemoryLayout {
  SharedRegion q;        // Q_i codes, loaded once per CTA
  SharedRegion k;        // K_j codes, one per stage
  SharedRegion v;        // V_j (f16 [b_kv, d]) or V_j^T codes ([d, b_kv]), one per stage
  SharedRegion k_scales; // K_j's scales when they vary inside a KV block (0 bytes otherwise), one per stage
  int stage_offset = 0;  // where stage 0 starts
  int stage_bytes = 0;   // stage s starts at stage_offset + s * stage_bytes
  int stages = 0;
  // FP4 emulation (sm80, PvPath::e2m1_decoded): q is Q_i decoded (16-bit values), k/v/k_scales are K_j's codes, V_j^T's
  // codes and K_j's scales as staged by cp.async; the kernel decodes each stage into these two tiles (offsets from the
  // CTA's buffer), which the f16/bf16 mma path reads. Q_i's codes and scales are staged once in the same scratch,
  // before any K_j is decoded there.
  SharedRegion decoded_k; // K_j: [b_kv, d] 16-bit values
  SharedRegion decoded_v; // V_j^T: [d, b_kv] 16-bit values (channel-major: the B operand's own layout)
  SharedRegion q_codes;   // Q_i's e2m1 codes [b_q, d / 2], inside the decoded tiles' bytes
  SharedRegion q_scales;  // Q_i's microscales [b_q, d / group] (flat), after q_codes
  int total_bytes = 0;    // the kernel's dynamic shared memory
};

// One CTA per (Q block, q head, batch): grid = (ceil(tokens_q / block_q), heads_q, batch); or (persistent) a grid of
// `persistent_ctas_per_multiprocessor` CTAs per SM, each claiming tiles of that set one at a time from a counter in
// the workspace (WorkspaceLayout::attention_counters, cleared before each launch).
struct GridMapping {
  int block_q = 128;
  bool reverse_q_blocks = false;              // causal: the longest rows (last Q blocks) are scheduled first
  int persistent_ctas_per_multiprocessor = 0; // 0: one CTA per tile
  int64_t tilesFor(const ProblemShape &shape) const;
  // `multiprocessors`: the device's SM count (a persistent grid needs it; 0 gives one CTA per tile, which a persistent
  // kernel also runs correctly).
  std::array<int64_t, 3> gridFor(const ProblemShape &shape, int multiprocessors = 0) const;
  std::string description() const;
};

// One TMA box and the shared-memory chunk it fills: `inner_bytes` (32, 64 or 128: the swizzle span) x `rows`.
struct TensorMapBox {
  int inner_bytes = 0;
  int rows = 0;
  bool operator==(const TensorMapBox &) const = default;
};

// Warp specialisation (the sm90 schedule): a producer warpgroup feeds `consumer_warpgroups` consumers through TMA
// loads described by tensor maps that the runtime encodes (cuTensorMapEncodeTiled) from these boxes.
struct WarpSpecialization {
  int consumer_warpgroups = 0; // 0: not warp-specialised (the sm80 schedule)
  int producer_registers = 0;  // setmaxnreg targets per thread
  int consumer_registers = 0;
  // false: no producer warpgroup; the consumer's thread 0 issues the TMA loads as its warpgroup releases each stage
  // (tunables.inline_loads: one consumer warpgroup of 128 threads, non-persistent, three CTAs per SM)
  bool producer_warpgroup = true;
  // A consumer computes S_j's softmax while its P~_(j-1) V wgmma runs; false where the P.V's accumulator, the outer f32
  // sum of O and S_j would not fit its registers together (the other consumer's GEMMs still overlap the softmax).
  bool softmax_under_product = true;
  TensorMapBox q_box; // Q_i: q_codes rows (head_dim x operand bytes), chunked along the row
  TensorMapBox k_box; // K_j: k_codes rows, chunked the same way
  TensorMapBox v_box; // V_j^T codes [d][tokens] chunked along the tokens, or V [tokens][2d bytes] along the bytes
  bool operator==(const WarpSpecialization &) const = default;
};

struct KernelPlan {
  std::string schedule;
  GpuArch arch = GpuArch::sm80;
  InputType input = InputType::f16;
  Tunables tunables;
  int head_dim = 128;

  int threads = 0;            // warps * 32
  int rows_per_warp = 0;      // block_q / warps
  int row_tiles_per_warp = 0; // rows_per_warp / 16: m16 tiles each warp owns

  ElementType qk_operand = ElementType::int8; // element type of q_codes / k_codes in the workspace
  MmaShape qk_mma;
  MmaShape pv_mma;
  PvPath pv_path = PvPath::f16_accumulate_f16;
  ValueSource v_source = ValueSource::input;
  ElementType v_operand = ElementType::f16; // element type of V as the mma reads it
  // 8-bit P.V: the columns of S are a permutation of the KV tokens chosen so that the S accumulator fragment of
  // m16n8k32 (2 consecutive columns per thread) becomes the A fragment of the next m16n8k32 (4 consecutive k).
  bool interleave_kv_tokens = false;

  ScaleIndexing q_scales;
  ScaleIndexing k_scales;
  int k_scales_per_block = 0; // distinct K scales in one KV block (1: a scalar per block, 0: unquantized)

  // 8-bit P.V on wgmma: the prologue writes V^T's tokens permuted within each group of 32, so that S's accumulator
  // registers are the A operand as they are (see WorkspaceLayout.h, VCodesTokenOrder).
  bool wgmma_value_token_order = false;
  // sm90 two-level accumulation: the kernel's KV blocks between flushes of the P.V accumulator into the outer f32 sum
  // (both in registers), at least as often as the variant's flush_period asks; 0: not two-level.
  int two_level_flush_blocks = 0;
  bool block_sparse = false; // sm90: the CTA's mask row as a bitmask in shared memory (part of shared.total_bytes)
  // The variant's packed_sequences (issue 28): the prologue and the kernel read each sequence's length and token
  // offset from SageSequenceOffsets (KernelAbi.h); the workspace keeps the dense [batch, heads, padded tokens] layout
  // with batch = sequences and tokens = the call's maximum sequence lengths.
  bool packed_sequences = false;

  // sm120.mma_fp4: microscaled FP4 operands (e2m1 codes, two per byte; one UE4M3 or UE8M0 scale per
  // `fp4_scale_group` elements along each matmul's reduction axis; codegen/README.md, "FP4 operands").
  int fp4_scale_group = 0;      // 16 (NVFP4, UE4M3) or 32 (MXFP4, UE8M0); 0: not an FP4 plan
  bool fp4_two_level_p = false; // P: s_P1 = rowmax(P~) / (448 * 6) per row of the S tile, then the microscales
  bool fp4_delta_s = false;     // Q smoothing: S += delta_s[Q block][token], the prologue's GEMV
  // The token order of k_codes that the kernel expects from the prologue. The sm120 kernel permutes S's columns
  // itself, by reading K's rows in shared memory in fp4ScoreColumnToken order, so the prologue writes K as it is.
  KCodesTokenOrder k_codes_token_order = KCodesTokenOrder::natural;
  bool fp4_permute_k_rows_in_shared = false; // the kernel applies fp4ScoreColumnToken to K's rows (sm120)

  SharedMemoryLayout shared;
  int min_blocks_per_multiprocessor = 1; // __launch_bounds__ occupancy target
  GridMapping grid;
  WarpSpecialization warp_specialization; // sm90 only
};

// Element size in bytes of a storage type (int4/e2m1 are packed, so they report 1 for a pair).
int bytesOf(ElementType type);

} // namespace sage::schedules
