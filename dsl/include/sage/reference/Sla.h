// The CPU reference of SLA (sparse-linear attention, issue 13): mask prediction, the forward of Algorithm 1 and the
// backward of Algorithm 2, in double precision. The oracle of the SLA kernels.
//
//  - Mask prediction: pool(Q), pool(K) are means over each block's tokens (a short last block averages what it
//    has), S_c = pool(Q) pool(K)^T / sqrt(d), P_c = softmax over each row of S_c. Each row is ranked by S_c
//    descending (the softmax keeps the order; ranking the logits avoids its rounding), ties by the lower kv block
//    first: the first criticalBlocksPerRow() ranks are critical, the last negligibleBlocksPerRow() negligible.
//  - The sparse part O^s is the variant's own attention (its quantizers included) over the critical blocks: the
//    block_sparse reference (runReference) with keep = critical.
//  - The linear branch: phi(Q), phi(K) row by row, h_j = phi(K_j)^T V_j, z_j = colsum(phi(K_j)) per kv block,
//    H_i, Z_i their sums over the blocks marginal in q block i, O^l = phi(Q_i) H_i / (phi(Q_i) Z_i); 0 where the
//    denominator is 0 (a row with no marginal block). Always in double, unquantized.
//  - O = O^s + Proj(O^l), Proj(x) = x W^T + b (torch.nn.Linear's convention).
//  - The backward differentiates the exact formula (the sparse part unquantized) with the classes held fixed.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/reference/HostTensor.h"
#include "sage/reference/Reference.h"

#include <cstdint>
#include <vector>

namespace sage::reference {

// M_c for every (batch, q head): [batch, heads_q, q_blocks, kv_blocks].
struct BlockClasses {
  int64_t batch = 0, heads = 0, q_blocks = 0, kv_blocks = 0;
  std::vector<BlockClass> classes;

  BlockClass at(int64_t b, int64_t h, int64_t q_block, int64_t kv_block) const {
    return classes[static_cast<size_t>(((b * heads + h) * q_blocks + q_block) * kv_blocks + kv_block)];
  }
};

struct MaskPrediction {
  BlockClasses classes;
  std::vector<double> compressed; // P_c in the same order as the classes
};

// Predicts M_c for Q [b, h_q, n_q, d] and K [b, h_kv, n_kv, d] with the variant's b_q, b_kv and SLA spec.
// Throws std::invalid_argument naming the argument for bad shapes, a variant without SLA, or non-finite pooled scores.
MaskPrediction predictBlockClasses(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k);

// The critical blocks as the block mask of the sparse part.
BlockMask criticalBlockMask(const BlockClasses &classes);

// The variant's sparse part: the same attention without the SLA fields (block_sparse over the critical blocks).
AttentionVariant sparsePartOf(const AttentionVariant &variant);

// Proj: y = x W^T + b with W [d, d] row-major (out, in) and b [d] (empty: no bias).
struct Projection {
  int64_t dim = 0;
  std::vector<double> weight;
  std::vector<double> bias;
};

struct SlaResult {
  BlockClasses classes;
  AttentionResult sparse;     // O^s and the sparse part's LSE
  std::vector<double> linear; // O^l, [batch, heads_q, n_q, d]
  std::vector<double> output; // O = O^s + Proj(O^l), [batch, heads_q, n_q, d]
};

// The SLA forward. `classes` given: use them (a kernel's predicted mask, or hand-made ones); else predict them.
SlaResult runSlaReference(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                          const HostTensor &v, const Projection &projection, const BlockClasses *classes = nullptr);

// phi applied to one row of `dim` values (SlaSpec's feature maps), and the vector-Jacobian product of it.
void applyFeatureMap(FeatureMap map, const double *x, double *y, int64_t dim);
void featureMapBackward(FeatureMap map, const double *x, const double *dy, double *dx, int64_t dim);

struct SlaGradients {
  std::vector<double> dq;         // [batch, heads_q, n_q, d]
  std::vector<double> dk, dv;     // [batch, heads_kv, n_kv, d] (summed over the q heads of a GQA group)
  std::vector<double> dq_phi;     // d loss / d phi(Q), [batch, heads_q, n_q, d]
  std::vector<double> dk_phi;     // d loss / d phi(K), [batch, heads_kv, n_kv, d]
  std::vector<double> dweight;    // [d, d]
  std::vector<double> dbias;      // [d]
  std::vector<double> sparse_lse; // the exact sparse part's L (natural log), [batch, heads_q, n_q]
};

// Gradients of sum(d_output * O) for the exact SLA formula with the classes fixed (Algorithm 2, plus Proj and phi).
// `d_output` is dO in [batch, heads_q, n_q, d] order.
SlaGradients runSlaBackward(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                            const HostTensor &v, const Projection &projection, const BlockClasses &classes,
                            const std::vector<double> &d_output);

} // namespace sage::reference
