// The CPU reference of the backward pass (SageBwd, issue 12): runs a BackwardVariant in double precision with the
// same bit-exact quantizers as the forward reference, and the exact gradients of softmax attention.
//
// What is exact and what is modelled:
//  - Q, K, V and dO are quantized as the caller stores them (per_token / per_block int8 codes and f32 scales of
//    sage/numerics/Quantizers.h, or an f16/bf16 cast); P and dS are computed in double, rounded to f32 (the
//    kernel's registers) and quantized with one int8 scale per b_q x b_kv tile (numerics::quantizeInt8).
//  - P = exp(S / sqrt(d) - LSE) from the forward's natural-log LSE; D = rowsum(dO o O) from the O the forward
//    stored; dS = P o (dP - D) from the unquantized P (Algorithm 3, line 9). An f32 "cast" of P and dS (exact-bwd)
//    keeps them in double.
//  - K smoothing (variant.smooth_k, issue 25): K_s = K - mean(K) per KV head (the mean summed in double and rounded
//    to f32, one f32 subtraction, as the forward's reference), quantized for S and dQ; P = exp(S_s / sqrt(d) -
//    (LSE - q . mean(K) / sqrt(d))) with the caller's q, in double. dQ = dS K_s equals dS K as dS's rows sum to 0.
//  - Products of dequantized values are summed in double; gradients accumulate in double (the kernels' f32).
//  - Causal masks are bottom-right aligned, as the forward's; tiles above the diagonal are skipped.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/ir/BackwardVariant.h"
#include "sage/reference/HostTensor.h"
#include "sage/reference/Metrics.h"

#include <cstdint>
#include <span>
#include <vector>

namespace sage::reference {

struct GradientResult {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, tokens_q = 0, tokens_kv = 0, dim = 0;
  std::vector<double> dq;     // [batch, heads_q, tokens_q, dim]
  std::vector<double> dk, dv; // [batch, heads_kv, tokens_kv, dim]: GQA sums over the query heads of a group
};

// Runs `variant` on Q [b, h_q, n_q, d], K, V [b, h_kv, n_kv, d], the forward's O and dO [b, h_q, n_q, d] and its
// natural-log LSE [b, h_q, n_q] (-inf for a fully masked row). Throws std::invalid_argument naming the argument when
// shapes disagree with each other or the variant, or exceed the reference's limits (Reference.h).
GradientResult runBackwardReference(const BackwardVariant &variant, const HostTensor &q, const HostTensor &k,
                                    const HostTensor &v, const HostTensor &o, const HostTensor &d_o,
                                    std::span<const double> lse);

// The training step on the CPU: the `forward` variant's reference (which must write the LSE) gives O, stored as
// the caller's tensors are (q's storage type), and the LSE; `backward` then runs on them. Masks must agree.
GradientResult runForwardBackwardReference(const AttentionVariant &forward, const BackwardVariant &backward,
                                           const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                           const HostTensor &d_o);

// The gradients of plain softmax(Q K^T / sqrt(d)) V with respect to Q, K and V for the incoming dO, in double with
// no tiling and no quantization: the ground truth.
GradientResult exactAttentionBackward(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                      const HostTensor &d_o, bool causal);

// One P or dS tile (row-major: b_q query rows of `columns` keys, as f32 values in double) quantized as `spec` says for
// `product` (dv, dq or dk), returned dequantized: an f32 cast keeps the doubles, f16/bf16 round; int8 or e4m3 take
// one scale for the whole tile (per_block; int8 as numerics::quantizeInt8) or one per token of the product's output
// (per_token: per key column for dV = P^T.dO and dK = dS^T.Q, per query row for dQ = dS.K).
std::vector<double> quantizeTile(std::span<const double> tile, int64_t columns, const QuantizerSpec &spec,
                                 BackwardProduct product);

struct GradientAccuracy {
  AccuracyMetrics dq, dk, dv;
};
GradientAccuracy compareGradients(const GradientResult &reference, const GradientResult &candidate);

} // namespace sage::reference
