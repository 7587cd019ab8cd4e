// SLA (sparse-linear attention, issue 13): the part of an AttentionVariant that says how blocks are classified and
// how the marginal ones are approximated. MLIR-free, like the rest of the vocabulary.
//
// SLA predicts a compressed attention map P_c = softmax(pool(Q) pool(K)^T / sqrt(d)) (mean pooling over the
// variant's b_q and b_kv tokens) and classes each (q block, kv block) pair per row of P_c: the top k_h% are critical
// (exact attention: the variant's block-sparse sparse part), the bottom k_l% negligible (skipped) and the rest
// marginal (the linear branch phi(Q) H / (phi(Q) Z) with H, Z summed over the marginal blocks). The output is
// O = O^s + Proj(O^l), Proj a d x d linear map (with bias) owned by the caller.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace sage {

// The feature map phi of the linear branch, applied to each token's row of Q and K.
enum class FeatureMap : uint8_t {
  softmax,      // softmax over the head-dim features (the paper's choice)
  elu_plus_one, // elu(x) + 1
  relu,         // max(x, 0)
};

// The classes of the compressed mask M_c (the paper's 1 / 0 / -1).
enum class BlockClass : int8_t { negligible = -1, marginal = 0, critical = 1 };

struct SlaSpec {
  bool enabled = false;
  double critical_percent = 5.0;    // k_h: the top k_h% of each row of P_c are critical
  double negligible_percent = 10.0; // k_l: the bottom k_l% are negligible
  FeatureMap feature_map = FeatureMap::softmax;
  bool operator==(const SlaSpec &) const = default;
};

std::string_view nameOf(FeatureMap map);
std::optional<FeatureMap> parseFeatureMap(std::string_view text);

// Blocks of one row of M_c in each class, for a row of `kv_blocks` blocks. Critical: ceil(k_h% * kv_blocks), at
// least 1 (every query attends somewhere exactly); negligible: floor(k_l% * kv_blocks), at most what the critical
// blocks leave. A tiny relative tolerance keeps percentages such as 5% of 20 blocks (= 1.0000000000000002 in
// binary) from rounding up to the next block.
int64_t criticalBlocksPerRow(const SlaSpec &spec, int64_t kv_blocks);
int64_t negligibleBlocksPerRow(const SlaSpec &spec, int64_t kv_blocks);

} // namespace sage
