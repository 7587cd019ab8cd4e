// The normalized, MLIR-free description of one attention backward program (SageBwd, issue 12).
//
// A verified `sage.attention_backward` program is lowered into this struct by BackwardProgram::variant(). The
// backward recomputes S = Q.K^T and P = exp(S / sqrt(d) - LSE) from the forward's LSE, forms D = rowsum(dO o O),
// and runs four more matrix products: dP = dO.V^T, dV = P^T.dO, dQ = dS.K, dK = dS^T.Q with dS = P o (dP - D)
// (SageAttention3's Algorithm 3). Each product names the quantizers of its two operands; every product is
// dequantized by its operands' scales and accumulated in f32. With `smooth_k`, the K that S and dQ quantize is
// K - mean(K) per KV head, and P is recomputed with the LSE shifted by q . mean(K) / sqrt(d) per row (issue 25).
#pragma once

#include "sage/ir/AttentionVariant.h"

#include <array>
#include <string>
#include <string_view>

namespace sage {

// The five matrix products of the backward pass, by what they compute.
enum class BackwardProduct : uint8_t {
  s,  // S = Q.K^T, recomputed (reduces over channels)
  dp, // dP = dO.V^T (reduces over channels; FP16 in SageBwd, the paper's Table 1(c) ablation quantizes it)
  dv, // dV = P^T.dO (reduces over the query tokens of a Q tile)
  dq, // dQ = dS.K (reduces over the key tokens of a KV tile)
  dk, // dK = dS^T.Q (reduces over the query tokens of a Q tile)
};
inline constexpr std::array<BackwardProduct, 5> kBackwardProducts{
    BackwardProduct::s, BackwardProduct::dp, BackwardProduct::dv, BackwardProduct::dq, BackwardProduct::dk};

struct BackwardProductSpec {
  QuantizerSpec lhs, rhs; // lhs . rhs (transposes implied by the product)
  AccumulatorType accumulator = AccumulatorType::f32;
  bool operator==(const BackwardProductSpec &) const = default;
};

struct BackwardVariant {
  std::string name;
  int version = kIrVersion;
  int head_dim = 128;
  int block_q = 64;  // Q tokens per tile (b_q): per_block scales of Q, dO; the rows of a P/dS tile
  int block_kv = 64; // K/V tokens per tile (b_kv): per_block scales of K, V; the columns of a P/dS tile
  MaskKind mask = MaskKind::none;
  // none, or sequence: S and dQ take K - mean(K) (one mean per KV head) and P the LSE shifted to match.
  SmoothScope smooth_k = SmoothScope::none;
  // Indexed by BackwardProduct. P and dS are quantized per tile (b_q x b_kv, one scale) when per_block.
  std::array<BackwardProductSpec, 5> products{};

  const BackwardProductSpec &product(BackwardProduct which) const { return products[static_cast<size_t>(which)]; }
  BackwardProductSpec &product(BackwardProduct which) { return products[static_cast<size_t>(which)]; }
  bool operator==(const BackwardVariant &) const = default;
};

// "s", "dp", "dv", "dq", "dk".
std::string_view nameOf(BackwardProduct product);

} // namespace sage
