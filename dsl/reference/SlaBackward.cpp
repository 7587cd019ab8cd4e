// SLA's backward (Algorithm 2) of the exact formula, with Proj and phi: dQ, dK, dV, d phi(Q), d phi(K), dW, db.
#include "SlaShapes.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace sage::reference {
namespace {

struct HeadGradients {
  std::vector<double> &dq, &dk, &dv, &dq_phi, &dk_phi;
};

// FlashAttention's backward restricted to the critical blocks, for one q head (its K, V: the kv head's).
void sparseBackward(const AttentionVariant &variant, const BlockClasses &classes, int64_t b, int64_t h,
                    const std::vector<double> &q, const std::vector<double> &k, const std::vector<double> &v,
                    const double *d_output, int64_t n_q, int64_t n_kv, int64_t d, double *lse, double *dq, double *dk,
                    double *dv) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> scores(static_cast<size_t>(n_kv)), output(static_cast<size_t>(d));
  for (int64_t r = 0; r < n_q; ++r) {
    const int64_t i = r / variant.block_q;
    auto critical = [&](int64_t j) { return classes.at(b, h, i, j / variant.block_kv) == BlockClass::critical; };
    double row_max = -INFINITY;
    for (int64_t j = 0; j < n_kv; ++j)
      if (critical(j)) {
        double s = 0.0;
        for (int64_t c = 0; c < d; ++c)
          s += q[r * d + c] * k[j * d + c];
        scores[j] = s * scale;
        row_max = std::max(row_max, scores[j]);
      }
    if (row_max == -INFINITY)
      continue; // no critical block: O^s = 0, nothing to differentiate
    double sum = 0.0;
    for (int64_t j = 0; j < n_kv; ++j)
      if (critical(j))
        sum += std::exp(scores[j] - row_max);
    lse[r] = row_max + std::log(sum);
    // O^s_r and D_r = rowsum(dO^s o O^s)
    std::fill(output.begin(), output.end(), 0.0);
    for (int64_t j = 0; j < n_kv; ++j)
      if (critical(j))
        for (int64_t c = 0; c < d; ++c)
          output[c] += std::exp(scores[j] - lse[r]) * v[j * d + c];
    double delta = 0.0;
    for (int64_t c = 0; c < d; ++c)
      delta += d_output[r * d + c] * output[c];
    // P = exp(S - L); dV += P^T dO; dP = dO V^T; dS = P o (dP - D); dQ += dS K; dK += dS^T Q (both times 1/sqrt(d))
    for (int64_t j = 0; j < n_kv; ++j) {
      if (!critical(j))
        continue;
      const double p = std::exp(scores[j] - lse[r]);
      double dp = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        dv[j * d + c] += p * d_output[r * d + c];
        dp += d_output[r * d + c] * v[j * d + c];
      }
      const double ds = p * (dp - delta) * scale;
      for (int64_t c = 0; c < d; ++c) {
        dq[r * d + c] += ds * k[j * d + c];
        dk[j * d + c] += ds * q[r * d + c];
      }
    }
  }
}

} // namespace

SlaGradients runSlaBackward(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                            const HostTensor &v, const Projection &projection, const BlockClasses &classes,
                            const std::vector<double> &d_output) {
  sla_detail::validateSlaInputs(variant, q, k, v, projection, &classes);
  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens(), group = q.heads() / k.heads();
  const int64_t q_blocks = classes.q_blocks, kv_blocks = classes.kv_blocks;
  const auto q_size = static_cast<size_t>(q.batch() * q.heads() * n_q * d);
  const auto kv_size = static_cast<size_t>(k.batch() * k.heads() * n_kv * d);
  if (d_output.size() != q_size)
    throw std::invalid_argument("d_output: expected " + std::to_string(q_size) +
                                " values [batch, heads_q, n_q, d], got " + std::to_string(d_output.size()));
  // The forward's O^l (for dW and the linear branch's D^l).
  const SlaResult forward = runSlaReference(variant, q, k, v, projection, &classes);

  SlaGradients grads;
  grads.dq.assign(q_size, 0.0);
  grads.dq_phi.assign(q_size, 0.0);
  grads.dk.assign(kv_size, 0.0);
  grads.dv.assign(kv_size, 0.0);
  grads.dk_phi.assign(kv_size, 0.0);
  grads.dweight.assign(static_cast<size_t>(d * d), 0.0);
  grads.dbias.assign(static_cast<size_t>(d), 0.0);
  grads.sparse_lse.assign(static_cast<size_t>(q.batch() * q.heads() * n_q), -INFINITY);

  // Proj: dW = dO^T O^l, db = colsum(dO), dO^l = dO W.
  std::vector<double> d_linear(q_size, 0.0);
  for (size_t row = 0; row < q_size / static_cast<size_t>(d); ++row)
    for (int64_t out = 0; out < d; ++out) {
      const double g = d_output[row * d + out];
      grads.dbias[out] += g;
      for (int64_t in = 0; in < d; ++in) {
        grads.dweight[out * d + in] += g * forward.linear[row * d + in];
        d_linear[row * d + in] += g * projection.weight[out * d + in];
      }
    }

  std::vector<double> phi_row(static_cast<size_t>(d)), d_phi(static_cast<size_t>(d)),
      d_numerator(static_cast<size_t>(d));
  std::vector<double> d_input(static_cast<size_t>(d));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h_kv = 0; h_kv < k.heads(); ++h_kv) {
      const std::vector<double> k_values = sla_detail::headValues(k, b, h_kv);
      const std::vector<double> v_values = sla_detail::headValues(v, b, h_kv);
      const size_t kv_offset = static_cast<size_t>((b * k.heads() + h_kv) * n_kv * d);
      double *dk = &grads.dk[kv_offset], *dv = &grads.dv[kv_offset], *dk_phi = &grads.dk_phi[kv_offset];
      // h_j, z_j as in the forward; dh_j, dz_j gather dH_i, dZ_i of the q blocks where j is marginal (lines 13-14).
      std::vector<double> k_phi(static_cast<size_t>(n_kv * d));
      std::vector<double> h_blocks(static_cast<size_t>(kv_blocks * d * d), 0.0),
          z_blocks(static_cast<size_t>(kv_blocks * d), 0.0);
      for (int64_t t = 0; t < n_kv; ++t) {
        const int64_t j = t / variant.block_kv;
        applyFeatureMap(variant.sla.feature_map, &k_values[t * d], &k_phi[t * d], d);
        for (int64_t a = 0; a < d; ++a) {
          z_blocks[j * d + a] += k_phi[t * d + a];
          for (int64_t c = 0; c < d; ++c)
            h_blocks[(j * d + a) * d + c] += k_phi[t * d + a] * v_values[t * d + c];
        }
      }
      std::vector<double> dh_blocks(h_blocks.size(), 0.0), dz_blocks(z_blocks.size(), 0.0);

      for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        const std::vector<double> q_values = sla_detail::headValues(q, b, h);
        const size_t q_offset = static_cast<size_t>((b * q.heads() + h) * n_q * d);
        double *dq = &grads.dq[q_offset], *dq_phi = &grads.dq_phi[q_offset];
        sparseBackward(variant, classes, b, h, q_values, k_values, v_values, &d_output[q_offset], n_q, n_kv, d,
                       &grads.sparse_lse[static_cast<size_t>((b * q.heads() + h) * n_q)], dq, dk, dv);

        std::vector<double> state_h(static_cast<size_t>(d * d)), state_z(static_cast<size_t>(d));
        std::vector<double> d_state_h(state_h.size()), d_state_z(state_z.size());
        for (int64_t i = 0; i < q_blocks; ++i) {
          std::fill(state_h.begin(), state_h.end(), 0.0);
          std::fill(state_z.begin(), state_z.end(), 0.0);
          for (int64_t j = 0; j < kv_blocks; ++j)
            if (classes.at(b, h, i, j) == BlockClass::marginal) {
              for (int64_t e = 0; e < d * d; ++e)
                state_h[e] += h_blocks[j * d * d + e];
              for (int64_t a = 0; a < d; ++a)
                state_z[a] += z_blocks[j * d + a];
            }
          std::fill(d_state_h.begin(), d_state_h.end(), 0.0);
          std::fill(d_state_z.begin(), d_state_z.end(), 0.0);
          const int64_t end = std::min(n_q, (i + 1) * variant.block_q);
          for (int64_t r = i * variant.block_q; r < end; ++r) {
            applyFeatureMap(variant.sla.feature_map, &q_values[r * d], phi_row.data(), d);
            double denominator = 0.0;
            for (int64_t a = 0; a < d; ++a)
              denominator += phi_row[a] * state_z[a];
            if (denominator == 0.0)
              continue; // O^l_r = 0 by definition: no gradient flows through it
            // O^l = num / den: d num = dO^l / den, d den = -<dO^l, O^l> / den (the paper's D^l_i)
            const double *dol = &d_linear[q_offset + static_cast<size_t>(r * d)];
            const double *ol = &forward.linear[q_offset + static_cast<size_t>(r * d)];
            double d_denominator = 0.0;
            for (int64_t c = 0; c < d; ++c) {
              d_numerator[c] = dol[c] / denominator;
              d_denominator -= dol[c] * ol[c] / denominator;
            }
            // d phi(Q_r) = dnum H^T + dden Z (line 5); dH_i += phi(Q_r)^T dnum, dZ_i += phi(Q_r) dden (line 4)
            for (int64_t a = 0; a < d; ++a) {
              double g = d_denominator * state_z[a];
              for (int64_t c = 0; c < d; ++c) {
                g += d_numerator[c] * state_h[a * d + c];
                d_state_h[a * d + c] += phi_row[a] * d_numerator[c];
              }
              d_state_z[a] += phi_row[a] * d_denominator;
              d_phi[a] = g;
              dq_phi[r * d + a] += g;
            }
            featureMapBackward(variant.sla.feature_map, &q_values[r * d], d_phi.data(), d_input.data(), d);
            for (int64_t c = 0; c < d; ++c)
              dq[r * d + c] += d_input[c];
          }
          for (int64_t j = 0; j < kv_blocks; ++j)
            if (classes.at(b, h, i, j) == BlockClass::marginal) {
              for (int64_t e = 0; e < d * d; ++e)
                dh_blocks[j * d * d + e] += d_state_h[e];
              for (int64_t a = 0; a < d; ++a)
                dz_blocks[j * d + a] += d_state_z[a];
            }
        }
      }
      // Line 17: d phi(K_t) = dh_j V_t + dz_j (per token of block j), dV_t += phi(K_t) dh_j.
      for (int64_t t = 0; t < n_kv; ++t) {
        const int64_t j = t / variant.block_kv;
        for (int64_t a = 0; a < d; ++a) {
          double g = dz_blocks[j * d + a];
          for (int64_t c = 0; c < d; ++c) {
            g += dh_blocks[(j * d + a) * d + c] * v_values[t * d + c];
            dv[t * d + c] += k_phi[t * d + a] * dh_blocks[(j * d + a) * d + c];
          }
          d_phi[a] = g;
          dk_phi[t * d + a] += g;
        }
        featureMapBackward(variant.sla.feature_map, &k_values[t * d], d_phi.data(), d_input.data(), d);
        for (int64_t c = 0; c < d; ++c)
          dk[t * d + c] += d_input[c];
      }
    }
  return grads;
}

} // namespace sage::reference
