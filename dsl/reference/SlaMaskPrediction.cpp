// SLA's mask prediction (Algorithm 1, lines 5-6): pooled Q.K^T, its row softmax P_c and the three block classes.
#include "SlaShapes.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace sage::reference {
namespace {

// Means of each block of `block` tokens of one head, [blocks][dim].
std::vector<double> pooled(const HostTensor &tensor, int64_t b, int64_t h, int64_t block) {
  const int64_t tokens = tensor.tokens(), dim = tensor.dim();
  const int64_t blocks = sla_detail::blocksOf(tokens, block);
  std::vector<double> means(static_cast<size_t>(blocks * dim), 0.0);
  for (int64_t block_index = 0; block_index < blocks; ++block_index) {
    const int64_t begin = block_index * block, end = std::min(tokens, begin + block);
    for (int64_t t = begin; t < end; ++t)
      for (int64_t c = 0; c < dim; ++c)
        means[block_index * dim + c] += tensor.at(b, h, t, c);
    for (int64_t c = 0; c < dim; ++c)
      means[block_index * dim + c] /= static_cast<double>(end - begin);
  }
  return means;
}

} // namespace

MaskPrediction predictBlockClasses(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k) {
  if (!variant.sla.enabled)
    throw std::invalid_argument("variant: '" + variant.name + "' is not an SLA variant (no mask prediction)");
  const double critical = variant.sla.critical_percent, negligible = variant.sla.negligible_percent;
  if (!(critical > 0.0 && critical <= 100.0 && negligible >= 0.0 && negligible < 100.0 &&
        critical + negligible <= 100.0))
    throw std::invalid_argument("variant.sla: expected k_h in (0, 100], k_l in [0, 100) and k_h + k_l <= 100, got " +
                                std::to_string(critical) + " and " + std::to_string(negligible));
  if (q.dim() != k.dim() || q.batch() != k.batch() || k.heads() <= 0 || q.heads() % k.heads() != 0)
    throw std::invalid_argument("q, k: need equal batch and head dims, and heads_q a multiple of heads_kv");
  const int64_t d = q.dim(), q_blocks = sla_detail::blocksOf(q.tokens(), variant.block_q),
                kv_blocks = sla_detail::blocksOf(k.tokens(), variant.block_kv), group = q.heads() / k.heads();
  const int64_t critical_blocks = criticalBlocksPerRow(variant.sla, kv_blocks);
  const int64_t negligible_blocks = negligibleBlocksPerRow(variant.sla, kv_blocks);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  MaskPrediction prediction;
  prediction.classes = {q.batch(), q.heads(), q_blocks, kv_blocks, {}};
  const auto entries = static_cast<size_t>(q.batch() * q.heads() * q_blocks * kv_blocks);
  prediction.classes.classes.assign(entries, BlockClass::marginal);
  prediction.compressed.assign(entries, 0.0);
  std::vector<double> logits(static_cast<size_t>(kv_blocks));
  std::vector<int64_t> order(static_cast<size_t>(kv_blocks));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h = 0; h < q.heads(); ++h) {
      const std::vector<double> q_pool = pooled(q, b, h, variant.block_q);
      const std::vector<double> k_pool = pooled(k, b, h / group, variant.block_kv);
      for (int64_t i = 0; i < q_blocks; ++i) {
        double row_max = -INFINITY;
        for (int64_t j = 0; j < kv_blocks; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c)
            s += q_pool[i * d + c] * k_pool[j * d + c];
          logits[j] = s * scale;
          if (!std::isfinite(logits[j]))
            throw std::invalid_argument("q, k: the pooled score of q block " + std::to_string(i) + " and kv block " +
                                        std::to_string(j) + " is not finite (batch " + std::to_string(b) + ", head " +
                                        std::to_string(h) + ")");
          row_max = std::max(row_max, logits[j]);
        }
        const size_t row = static_cast<size_t>(((b * q.heads() + h) * q_blocks + i) * kv_blocks);
        double sum = 0.0;
        for (int64_t j = 0; j < kv_blocks; ++j)
          sum += std::exp(logits[j] - row_max);
        for (int64_t j = 0; j < kv_blocks; ++j)
          prediction.compressed[row + j] = std::exp(logits[j] - row_max) / sum;
        // One total order: higher score first, the lower kv block first among equals.
        std::iota(order.begin(), order.end(), int64_t(0));
        std::sort(order.begin(), order.end(),
                  [&](int64_t x, int64_t y) { return logits[x] != logits[y] ? logits[x] > logits[y] : x < y; });
        for (int64_t rank = 0; rank < kv_blocks; ++rank) {
          BlockClass &cls = prediction.classes.classes[row + order[rank]];
          if (rank < critical_blocks)
            cls = BlockClass::critical;
          else if (rank >= kv_blocks - negligible_blocks)
            cls = BlockClass::negligible;
        }
      }
    }
  return prediction;
}

BlockMask criticalBlockMask(const BlockClasses &classes) {
  BlockMask mask{classes.q_blocks, classes.kv_blocks, {}};
  mask.keep.reserve(classes.classes.size());
  for (BlockClass cls : classes.classes)
    mask.keep.push_back(cls == BlockClass::critical ? 1 : 0);
  return mask;
}

AttentionVariant sparsePartOf(const AttentionVariant &variant) {
  AttentionVariant sparse = variant;
  sparse.sla = SlaSpec{};
  return sparse;
}

} // namespace sage::reference
