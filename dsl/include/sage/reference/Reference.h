// The CPU reference: executes a verified attention variant in double precision with bit-exact
// quantizers. It is the oracle of every kernel test.
//
// What is exact and what is modelled:
//  - Quantizers (int8/int4/e4m3/e5m2 codes and f32 scales; e2m1 codes with ue4m3 or ue8m0 microscales, V's along
//    its tokens; P's two-level scale), K/V smoothing and Q's folded scale are the exact f32 arithmetic of
//    sage/numerics/Quantizers.h, so a kernel computes the same codes bit for bit.
//  - Q smoothing's GEMV (sage.q_mean_correction) adds mean(Q_i) . K_j^T in double, with K as it enters its
//    quantizer (smoothed, unquantized), before the softmax scale.
//  - Products of codes are summed exactly in double, then scaled by the f32 scales.
//  - The online softmax runs tile by tile (b_q x b_kv), exactly as the kernels do, in double.
//  - An f16 accumulator is modelled by rounding to f16 after every 16-token step of P.V (the k extent of
//    mma.m16n8k16) and after each rescale; f32_two_level's inner accumulator rounds to f32 every 32 tokens.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/reference/HostTensor.h"

#include <cstdint>
#include <span>
#include <vector>

namespace sage::reference {

struct AttentionResult {
  int64_t batch = 0, heads = 0, tokens = 0, dim = 0;
  std::vector<double> output; // O in [batch, heads_q, tokens_q, dim] order
  std::vector<double> lse;    // natural-log LSE in [batch, heads_q, tokens_q]; -inf for fully masked rows
};

// A block mask for block_sparse variants: [batch, heads_q, q_blocks, kv_blocks], non-zero = compute.
struct BlockMask {
  int64_t q_blocks = 0, kv_blocks = 0;
  std::vector<uint8_t> keep;
};

// The CPU reference runs in double precision on one thread: shapes whose memory or work it would not finish are
// refused before anything is allocated. Memory: the f32 inputs, two f64 outputs (a variant's and the exact one) and
// one head's f64 working copies of Q, K and V. Work: the multiply-adds of Q.K^T and P.V over all heads.
inline constexpr int64_t kMaxReferenceBytes = int64_t(16) << 30;
inline constexpr int64_t kMaxReferenceWork = int64_t(1) << 38;

// Throws std::invalid_argument with the estimate and the limit when a run of this shape exceeds one of them.
void checkReferenceShape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t n_q, int64_t n_kv, int64_t d);

// Runs `variant` on Q [b, h_q, n_q, d], K and V [b, h_kv, n_kv, d] (GQA: h_kv divides h_q).
// Throws std::invalid_argument naming the argument when shapes disagree with each other or the variant, and for a
// variant with packed_sequences (runPackedReference runs those).
AttentionResult runReference(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                             const HostTensor &v, const BlockMask *block_mask = nullptr);

// Plain softmax(Q K^T / sqrt(d)) V in double with no tiling and no quantization: the ground truth.
AttentionResult exactAttention(const HostTensor &q, const HostTensor &k, const HostTensor &v, bool causal);

// Variable-length batches (issue 28; FlashAttention's varlen). Q is [1, h_q, total_q, d] and K, V [1, h_kv, total_kv,
// d]: sequence b is tokens cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of Q and cu_seqlens_kv[b] .. of K and V. Each
// offset list has batch + 1 entries (at least 2), starts at 0, never decreases and ends at its tensor's token count;
// a sequence may be empty. The result is over [1, h_q, total_q, d] (LSE [1, h_q, total_q]): sequence b's rows are
// exactly (bit for bit) runReference of the dense variant on sequence b alone, K smoothing's mean, V's scales, Q's
// blocks and the causal mask's bottom-right alignment (row i sees key j iff j <= i + len_kv - len_q) all per
// sequence; rows of a sequence without keys are O = 0, LSE = -inf. Throws std::invalid_argument naming the argument
// for a dense variant (packed_sequences false), offsets that break the rules above or shapes that disagree.
AttentionResult runPackedReference(const AttentionVariant &packed, const HostTensor &q, const HostTensor &k,
                                   const HostTensor &v, std::span<const int64_t> cu_seqlens_q,
                                   std::span<const int64_t> cu_seqlens_kv);
// exactAttention per sequence of a packed batch (the same layout and offsets; causal bottom-right per sequence).
AttentionResult exactPackedAttention(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                     std::span<const int64_t> cu_seqlens_q, std::span<const int64_t> cu_seqlens_kv,
                                     bool causal);

} // namespace sage::reference
