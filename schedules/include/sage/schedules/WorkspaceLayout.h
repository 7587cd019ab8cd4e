// The contract between the quantization prologue kernel and the attention kernel: what the
// prologue writes into the caller's workspace, where, and in which layout.
//
// Logical shapes: Q [b, h_q, n_q, d], K and V [b, h_kv, n_kv, d]. Inputs are f16 or bf16 (the InputType),
// HND or NHD with arbitrary outer strides (the last dim is contiguous). The prologue writes compact, padded,
// head-major (HND) buffers, so the attention kernel only ever reads one layout:
//
//   q_codes   int8/e4m3  [b, h_q,  padded_q,  d]      token-major, padded rows are 0; int4 codes are stored one
//             per byte (int8 values in [-7, 7], the legalized s4 -> s8 operand); an unquantized Q
//             (granularity none) is stored in the input type instead (2 bytes, times the folded
//             softmax scale when Q folds it), with the same row order and zero padding
//   q_scales  f32        [b, h_q,  q_scale_count]     one per quantization group (see groupsPerBlock)
//   k_codes   int8/e4m3  [b, h_kv, padded_kv, d]      K after smoothing (K - mean_k), padded rows 0; an
//             unquantized K is stored in the input type (2 bytes), like Q
//   k_scales  f32        [b, h_kv, k_scale_count]
//   k_mean    f32        [b, h_kv, d]                 mean of K over tokens (LSE correction)
//   q_mean    f32        [b, h_q,  q_blocks, d]       Q block means, only when Q is smoothed
//   v_values  f16        [b, h_kv, padded_kv, d]      f16 P.V on a bf16 input or a smoothed V only
//   v_codes   int8/e4m3  [b, h_kv, d, padded_kv]      transposed (channel-major) for the mma B operand;
//             the token axis is in the VCodesTokenOrder the attention kernel asked the prologue for
//   v_scales  f32        [b, h_kv, d]                 per-channel V scale
//   v_mean    f32        [b, h_kv, d]                 mean of V over tokens, when V is smoothed
//   FP4 operands (e2m1 microscaled, issue 11; codegen/README.md "FP4 operands"): q_codes [b, h_q, padded_q, d / 2]
//             and k_codes [b, h_kv, padded_kv, d / 2] (channel 2k in the low nibble of byte k), q_scales / k_scales
//             one byte per group of 16 (ue4m3) or 32 (ue8m0) channels of a token [.., tokens, d / group] (so
//             q_scale_count = padded_q * d / group), v_codes = V^T [b, h_kv, d, padded_kv / 2] (token 2t in the low
//             nibble of byte t) and v_scales [b, h_kv, d, padded_kv / group] along the tokens
//   delta_s   f32        [b, h_q, q_blocks, padded_kv] Q smoothing's correction (sage.q_mean_correction):
//             delta_s[i, j] = sum_c q_mean[i, c] * (K[j, c] - mean_k[c]) in f32, in Q's domain (the folded
//             softmax scale included), 0 for padded tokens; the attention kernel adds it to S
//   prologue_statistics                              the prologue's scratch between its statistics and the
//             tiles that wait for them (the attention kernel never reads it): per-tensor Q's block amax
//             [b, h_q, q_blocks] f32, then per (KV head, slice of tokens, channel) K's and V's sums (f32) and
//             min/max (input type), for the variants that reduce K or V over the sequence; slices <=
//             min(kMaxPrologueStatisticsSlices, ceil(tokens_kv / 16)) bound its size
//   prologue_counters u32 [1 + b * h_kv]            the one-pass prologue's ticket and, per KV head, the count of
//             statistics CTAs that have published (variants with column statistics); the caller zeroes it
//             before every one-pass launch (AttentionRunner does)
//   attention_counters u32 [1]                       the persistent sm90 kernel's tile counter: its CTAs claim tiles
//             from it (sm90/tiles.cuh's TileSchedule); zeroed before each launch of a persistent kernel
//
// v_codes' token order: `natural` puts token t at position t. `wgmma_interleaved_32` (for a Hopper wgmma P.V
// whose 8-bit A operand is the S accumulator itself, with no register shuffles) permutes the tokens inside every
// group of 32: position p of the group holds token
//   perm(p) = 16 (p / 16) + 8 ((p % 4) / 2) + 2 ((p % 16) / 4) + p % 2
// because an accumulator gives the thread with lane % 4 = q the columns 8j + 2q + {0, 1}, while its 8-bit A
// fragment holds k = 4q + {0..3} and 16 + 4q + {0..3}. padded_kv is a multiple of block_kv, itself a multiple of
// 32 for this order, so groups never straddle the end; padded tokens hold code 0 wherever they land.
//
// A buffer the variant and input type do not use has 0 bytes. Every buffer starts at a 256-byte aligned
// offset. Sizes depend on (b, heads, n_q, n_kv) only through the formulas below, so a caller can size the
// workspace before any kernel exists.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/InputType.h"

#include <cstddef>
#include <cstdint>

namespace sage::schedules {

struct ProblemShape {
  int64_t batch = 1;
  int64_t heads_q = 1;
  int64_t heads_kv = 1;
  int64_t tokens_q = 0;
  int64_t tokens_kv = 0;
  int64_t head_dim = 128;
  bool operator==(const ProblemShape &) const = default;
};

// The most slices of tokens the prologue's column statistics split a KV head into (its tunables are checked
// against this bound, which sizes prologue_statistics).
inline constexpr int64_t kMaxPrologueStatisticsSlices = 64;

enum class VCodesTokenOrder : uint8_t { natural, wgmma_interleaved_32 };

// k_codes' token order. Every kernel today reads `natural` K codes: the sm120 FP4 kernel permutes S's columns by
// reading K's rows in shared memory permuted (KernelPlan::fp4_permute_k_rows_in_shared), so no prologue differs.
enum class KCodesTokenOrder : uint8_t { natural };

// The token that position `position` (0-based along padded_kv) of a v_codes row holds under `order`.
int64_t vCodesTokenAt(VCodesTokenOrder order, int64_t position);

struct BufferSlice {
  size_t offset = 0; // bytes from the workspace base, 256-byte aligned
  size_t bytes = 0;  // 0: the buffer is not used by this variant
};

struct WorkspaceLayout {
  int64_t padded_q = 0;      // tokens_q rounded up to block_q
  int64_t padded_kv = 0;     // tokens_kv rounded up to block_kv
  int64_t q_scale_count = 0; // scales per (batch, head) of Q
  int64_t k_scale_count = 0; // scales per (batch, head) of K
  BufferSlice q_codes, q_scales, k_codes, k_scales, k_mean, q_mean, v_values, v_codes, v_scales, v_mean, delta_s;
  BufferSlice prologue_statistics; // the prologue's scratch
  BufferSlice prologue_counters;   // the one-pass prologue's counters, zeroed before each of its launches
  BufferSlice attention_counters;  // a persistent attention kernel's tile counter, zeroed before each launch; last
  size_t total_bytes = 0;
};

// Scale groups of one quantization block of `block_tokens` tokens under `spec`:
// per_block -> block_tokens / group_tokens, per_warp -> block_tokens / group_tokens,
// per_thread -> (block_tokens / group_tokens) * 8, per_token -> block_tokens, per_tensor -> 1 (for the
// whole sequence), none -> 0.
int64_t groupsPerBlock(const QuantizerSpec &spec, int64_t block_tokens);

// Index of the scale group of token `token` (0-based within the sequence) under `spec`.
int64_t scaleGroupOfToken(const QuantizerSpec &spec, int64_t block_tokens, int64_t token);

// Bytes per element of Q's (or K's) copy in the workspace: 1 for 8-bit codes, 2 for an unquantized operand
// (granularity none), which the prologue stores in the input type.
int64_t workspaceOperandBytes(const QuantizerSpec &spec);

// What the prologue writes for this variant, its Q, K and V being of type `input`.
WorkspaceLayout computeWorkspaceLayout(const AttentionVariant &variant, const ProblemShape &shape, InputType input);

} // namespace sage::schedules
