// SLA's forward (Algorithm 1): the sparse part through the block-sparse reference, the linear branch with h_j, z_j
// precomputed per kv block, and O = O^s + Proj(O^l).
#include "SlaShapes.h"

#include "sage/numerics/CheckedSize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace sage::reference {
namespace sla_detail {

void validateSlaInputs(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                       const Projection &projection, const BlockClasses *classes) {
  auto require = [](bool condition, const std::string &message) {
    if (!condition)
      throw std::invalid_argument(message);
  };
  require(variant.sla.enabled, "variant: '" + variant.name + "' is not an SLA variant");
  require(q.dim() == variant.head_dim, "q: head dim " + std::to_string(q.dim()) + " does not match the variant's " +
                                           std::to_string(variant.head_dim));
  require(k.dim() == q.dim() && v.dim() == q.dim(), "k, v: head dims must equal q's (" + std::to_string(q.dim()) + ")");
  require(k.batch() == q.batch() && v.batch() == q.batch(), "k, v: batch must equal q's");
  require(v.heads() == k.heads() && v.tokens() == k.tokens(), "v: must have k's heads and tokens");
  require(k.heads() > 0 && q.heads() % k.heads() == 0, "q: heads_q must be a multiple of heads_kv");
  const int64_t d = q.dim();
  require(projection.dim == d && static_cast<int64_t>(projection.weight.size()) == d * d,
          "projection: expected a " + std::to_string(d) + " x " + std::to_string(d) + " weight, got dim " +
              std::to_string(projection.dim) + " with " + std::to_string(projection.weight.size()) + " values");
  require(projection.bias.empty() || static_cast<int64_t>(projection.bias.size()) == d,
          "projection: the bias has " + std::to_string(projection.bias.size()) + " values, expected 0 or " +
              std::to_string(d));
  if (classes) {
    const int64_t q_blocks = blocksOf(q.tokens(), variant.block_q), kv_blocks = blocksOf(k.tokens(), variant.block_kv);
    require(classes->batch == q.batch() && classes->heads == q.heads() && classes->q_blocks == q_blocks &&
                classes->kv_blocks == kv_blocks &&
                static_cast<int64_t>(classes->classes.size()) == q.batch() * q.heads() * q_blocks * kv_blocks,
            "classes: expected [batch, heads_q, " + std::to_string(q_blocks) + ", " + std::to_string(kv_blocks) +
                "] block classes");
  }
  // The linear branch's d x d states per kv block on top of what the attention needs.
  checkReferenceShape(q.batch(), q.heads(), k.heads(), q.tokens(), k.tokens(), d);
  const auto states = numerics::checkedProduct({blocksOf(k.tokens(), variant.block_kv), d, d, 8});
  require(states && *states <= kMaxReferenceBytes, "k: too many kv blocks for the linear branch's per-block states");
}

std::vector<double> headValues(const HostTensor &tensor, int64_t b, int64_t h) {
  std::vector<double> values(static_cast<size_t>(tensor.tokens() * tensor.dim()));
  for (int64_t t = 0; t < tensor.tokens(); ++t)
    for (int64_t c = 0; c < tensor.dim(); ++c)
      values[t * tensor.dim() + c] = tensor.at(b, h, t, c);
  return values;
}

} // namespace sla_detail

void applyFeatureMap(FeatureMap map, const double *x, double *y, int64_t dim) {
  switch (map) {
  case FeatureMap::softmax: {
    const double top = *std::max_element(x, x + dim);
    double sum = 0.0;
    for (int64_t c = 0; c < dim; ++c)
      sum += (y[c] = std::exp(x[c] - top));
    for (int64_t c = 0; c < dim; ++c)
      y[c] /= sum;
    return;
  }
  case FeatureMap::elu_plus_one:
    for (int64_t c = 0; c < dim; ++c)
      y[c] = x[c] > 0.0 ? x[c] + 1.0 : std::exp(x[c]);
    return;
  case FeatureMap::relu:
    for (int64_t c = 0; c < dim; ++c)
      y[c] = std::max(x[c], 0.0);
    return;
  }
}

void featureMapBackward(FeatureMap map, const double *x, const double *dy, double *dx, int64_t dim) {
  switch (map) {
  case FeatureMap::softmax: { // dx = y * (dy - <dy, y>)
    std::vector<double> y(static_cast<size_t>(dim));
    applyFeatureMap(map, x, y.data(), dim);
    double inner = 0.0;
    for (int64_t c = 0; c < dim; ++c)
      inner += dy[c] * y[c];
    for (int64_t c = 0; c < dim; ++c)
      dx[c] = y[c] * (dy[c] - inner);
    return;
  }
  case FeatureMap::elu_plus_one:
    for (int64_t c = 0; c < dim; ++c)
      dx[c] = dy[c] * (x[c] > 0.0 ? 1.0 : std::exp(x[c]));
    return;
  case FeatureMap::relu:
    for (int64_t c = 0; c < dim; ++c)
      dx[c] = x[c] > 0.0 ? dy[c] : 0.0;
    return;
  }
}

SlaResult runSlaReference(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                          const HostTensor &v, const Projection &projection, const BlockClasses *classes) {
  sla_detail::validateSlaInputs(variant, q, k, v, projection, classes);
  SlaResult result;
  result.classes = classes ? *classes : predictBlockClasses(variant, q, k).classes;
  const BlockMask critical = criticalBlockMask(result.classes);
  result.sparse = runReference(sparsePartOf(variant), q, k, v, &critical);

  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens(), group = q.heads() / k.heads();
  const int64_t q_blocks = result.classes.q_blocks, kv_blocks = result.classes.kv_blocks;
  result.linear.assign(result.sparse.output.size(), 0.0);
  std::vector<double> phi_row(static_cast<size_t>(d)), numerator(static_cast<size_t>(d));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h_kv = 0; h_kv < k.heads(); ++h_kv) {
      // Line 4: h_j = phi(K_j)^T V_j, z_j = colsum(phi(K_j)) for every kv block.
      const std::vector<double> k_values = sla_detail::headValues(k, b, h_kv);
      const std::vector<double> v_values = sla_detail::headValues(v, b, h_kv);
      std::vector<double> h_blocks(static_cast<size_t>(kv_blocks * d * d), 0.0);
      std::vector<double> z_blocks(static_cast<size_t>(kv_blocks * d), 0.0);
      for (int64_t t = 0; t < n_kv; ++t) {
        const int64_t j = t / variant.block_kv;
        applyFeatureMap(variant.sla.feature_map, &k_values[t * d], phi_row.data(), d);
        for (int64_t a = 0; a < d; ++a) {
          z_blocks[j * d + a] += phi_row[a];
          for (int64_t c = 0; c < d; ++c)
            h_blocks[(j * d + a) * d + c] += phi_row[a] * v_values[t * d + c];
        }
      }
      for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        const std::vector<double> q_values = sla_detail::headValues(q, b, h);
        std::vector<double> state_h(static_cast<size_t>(d * d)), state_z(static_cast<size_t>(d));
        for (int64_t i = 0; i < q_blocks; ++i) {
          // Line 13: H_i, Z_i summed over the marginal blocks.
          std::fill(state_h.begin(), state_h.end(), 0.0);
          std::fill(state_z.begin(), state_z.end(), 0.0);
          for (int64_t j = 0; j < kv_blocks; ++j) {
            if (result.classes.at(b, h, i, j) != BlockClass::marginal)
              continue;
            for (int64_t e = 0; e < d * d; ++e)
              state_h[e] += h_blocks[j * d * d + e];
            for (int64_t a = 0; a < d; ++a)
              state_z[a] += z_blocks[j * d + a];
          }
          // Line 16: O^l_i = phi(Q_i) H_i / (phi(Q_i) Z_i).
          const int64_t end = std::min(n_q, (i + 1) * variant.block_q);
          for (int64_t r = i * variant.block_q; r < end; ++r) {
            applyFeatureMap(variant.sla.feature_map, &q_values[r * d], phi_row.data(), d);
            double denominator = 0.0;
            std::fill(numerator.begin(), numerator.end(), 0.0);
            for (int64_t a = 0; a < d; ++a) {
              denominator += phi_row[a] * state_z[a];
              for (int64_t c = 0; c < d; ++c)
                numerator[c] += phi_row[a] * state_h[a * d + c];
            }
            if (denominator == 0.0)
              continue;
            const size_t row = static_cast<size_t>(((b * q.heads() + h) * n_q + r) * d);
            for (int64_t c = 0; c < d; ++c)
              result.linear[row + c] = numerator[c] / denominator;
          }
        }
      }
    }

  // O = O^s + O^l W^T + b
  result.output = result.sparse.output;
  const size_t rows = result.output.size() / static_cast<size_t>(d);
  for (size_t row = 0; row < rows; ++row)
    for (int64_t out = 0; out < d; ++out) {
      double value = projection.bias.empty() ? 0.0 : projection.bias[out];
      for (int64_t in = 0; in < d; ++in)
        value += result.linear[row * d + in] * projection.weight[out * d + in];
      result.output[row * d + out] += value;
    }
  return result;
}

} // namespace sage::reference
