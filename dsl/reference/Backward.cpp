// The reference interpreter of a BackwardVariant: SageAttention3's Algorithm 3, tile by tile.
#include "sage/reference/Backward.h"

#include "OperandQuantizer.h"
#include "sage/numerics/CheckedSize.h"
#include "sage/numerics/Hadamard.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Reference.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>

namespace sage::reference {
namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

std::string shapeText(const HostTensor &t) {
  return "[" + std::to_string(t.batch()) + ", " + std::to_string(t.heads()) + ", " + std::to_string(t.tokens()) + ", " +
         std::to_string(t.dim()) + "]";
}

void validateShapes(int head_dim, const HostTensor &q, const HostTensor &k, const HostTensor &v, const HostTensor *o,
                    const HostTensor &d_o, const std::span<const double> *lse) {
  require(q.dim() == head_dim,
          "q: head dim " + std::to_string(q.dim()) + " does not match the variant's " + std::to_string(head_dim));
  require(k.dim() == q.dim() && v.dim() == q.dim(), "k, v: head dims must equal q's (" + std::to_string(q.dim()) + ")");
  require(k.batch() == q.batch() && v.batch() == q.batch(), "k, v: batch must equal q's");
  require(v.heads() == k.heads() && v.tokens() == k.tokens(), "v: must have k's shape " + shapeText(k));
  require(q.heads() % k.heads() == 0, "q: heads_q (" + std::to_string(q.heads()) +
                                          ") must be a multiple of heads_kv (" + std::to_string(k.heads()) +
                                          ") for grouped-query attention");
  auto same_as_q = [&](const HostTensor &t) {
    return t.batch() == q.batch() && t.heads() == q.heads() && t.tokens() == q.tokens() && t.dim() == q.dim();
  };
  require(same_as_q(d_o), "d_o: expected q's shape " + shapeText(q) + ", got " + shapeText(d_o));
  if (o)
    require(same_as_q(*o), "o: expected q's shape " + shapeText(q) + ", got " + shapeText(*o));
  if (lse)
    require(static_cast<int64_t>(lse->size()) == q.batch() * q.heads() * q.tokens(),
            "lse: expected batch x heads_q x tokens_q = " + std::to_string(q.batch() * q.heads() * q.tokens()) +
                " values, got " + std::to_string(lse->size()));
  checkReferenceShape(q.batch(), q.heads(), k.heads(), q.tokens(), k.tokens(), q.dim());
  // Five products instead of the forward's two.
  const auto work = numerics::checkedProduct({q.batch(), q.heads(), q.tokens(), k.tokens(), q.dim(), 5});
  require(work && *work <= kMaxReferenceWork,
          "the CPU reference backward would do more than 2^38 multiply-adds (batch x heads x n_q x n_kv x d x 5)");
}

// x R^-1 in double for R = R_Q (or R_K when `for_k`) of sage/numerics/Hadamard.h: R_Q^-1 = D H 2^-e_K, R_K^-1 =
// D H 2^-e_Q (H H = d I), i.e. the signs, the Walsh-Hadamard transform and the other operand's power of two.
void unrotateRow(std::span<double> x, uint32_t seed, bool for_k) {
  const int d = static_cast<int>(x.size());
  for (int c = 0; c < d; ++c)
    if (numerics::hadamardNegates(seed, c))
      x[c] = -x[c];
  for (int h = 1; h < d; h *= 2)
    for (int c = 0; c < d; ++c)
      if ((c & h) == 0) {
        const double a = x[c], b = x[c + h];
        x[c] = a + b;
        x[c + h] = a - b;
      }
  const double scale = std::ldexp(1.0, -numerics::hadamardScaleExponent(d, !for_k));
  for (double &value : x)
    value *= scale;
}

// The quantized operands of one head, by quantizer: S and dK share Q's codes when their specs agree, and so on.
// `smoothed`: the head's rows minus their mean (K smoothing), which every quantizer of the head then takes.
// A spec with rotation_seed (issue 25; the IR's sage.bwd_quantize attribute, as sagebwd-rot) quantizes the
// rotated rows x R (R_K for K, `rotated_as_k`) and hands out the dequantized values rotated back, x^ R^-1 in double:
// every product then needs no unrotation of its own (S = Q~ K~^T with R_Q^-1 R_K^-T = I; dK = dS^T Q~ = (dS^T Q^)
// R_Q^-1, dQ = dS K~ likewise), as a kernel that unrotates dK and dQ after their products computes them.
class OperandCache {
public:
  OperandCache(const HostTensor &tensor, int64_t tile_tokens, bool smoothed = false, bool rotated_as_k = false)
      : tensor_(tensor), tile_tokens_(tile_tokens), smoothed_(smoothed), rotated_as_k_(rotated_as_k) {}
  void select(int64_t b, int64_t h) {
    if (b == b_ && h == h_)
      return;
    b_ = b;
    h_ = h;
    matrix_ = headMatrix(tensor_, b, h);
    if (smoothed_) { // gamma(K) = K - mean(K)
      mean_ = channelMean(matrix_, 0, matrix_.tokens);
      subtractRows(matrix_, 0, matrix_.tokens, mean_);
    }
    values_.clear();
  }
  const std::vector<float> &mean() const { return mean_; } // empty unless smoothed
  const std::vector<double> &values(const QuantizerSpec &spec) {
    for (auto &[cached_spec, cached] : values_)
      if (cached_spec == spec)
        return cached;
    if (!spec.rotation_seed) {
      values_.emplace_back(spec, quantizeOperand(matrix_, spec, tile_tokens_));
      return values_.back().second;
    }
    OperandMatrix rotated = matrix_;
    rotateRows(rotated, *spec.rotation_seed, rotated_as_k_);
    std::vector<double> values = quantizeOperand(rotated, spec, tile_tokens_);
    for (int64_t t = 0; t < rotated.tokens; ++t)
      unrotateRow(std::span<double>(values.data() + t * rotated.dim, static_cast<size_t>(rotated.dim)),
                  *spec.rotation_seed, rotated_as_k_);
    values_.emplace_back(spec, std::move(values));
    return values_.back().second;
  }

private:
  const HostTensor &tensor_;
  int64_t tile_tokens_;
  bool smoothed_, rotated_as_k_;
  int64_t b_ = -1, h_ = -1;
  OperandMatrix matrix_;
  std::vector<float> mean_;
  // A deque: values() hands out references that must survive later insertions (a vector would reallocate).
  std::deque<std::pair<QuantizerSpec, std::vector<double>>> values_;
};

size_t index4(int64_t heads, int64_t tokens, int64_t dim, int64_t b, int64_t h, int64_t t) {
  return static_cast<size_t>(((b * heads + h) * tokens + t) * dim);
}

} // namespace

std::vector<double> quantizeTile(std::span<const double> tile, int64_t columns, const QuantizerSpec &spec,
                                 BackwardProduct product) {
  std::vector<double> result(tile.begin(), tile.end());
  if (spec.granularity == Granularity::none) {
    if (spec.dtype == ElementType::f16)
      for (double &value : result)
        value = numerics::roundToHalf(static_cast<float>(value));
    else if (spec.dtype == ElementType::bf16)
      for (double &value : result)
        value = numerics::roundToBfloat16(static_cast<float>(value));
    else if (spec.dtype != ElementType::f32)
      throw std::invalid_argument("quantizeTile: a cast to f32, f16 or bf16 expected, got " +
                                  std::string(nameOf(spec.dtype)));
    return result;
  }
  const bool int8 = spec.dtype == ElementType::int8, e4m3 = spec.dtype == ElementType::e4m3;
  if ((!int8 && !e4m3) || (spec.granularity != Granularity::per_block && spec.granularity != Granularity::per_token))
    throw std::invalid_argument("quantizeTile: P and dS tiles are int8 or e4m3 with one scale per tile (per_block) "
                                "or one per token of the product's output (per_token), got " +
                                std::string(nameOf(spec.dtype)) + " " + std::string(nameOf(spec.granularity)));
  if (product != BackwardProduct::dv && product != BackwardProduct::dq && product != BackwardProduct::dk)
    throw std::invalid_argument("quantizeTile: P and dS tiles feed dV, dQ or dK, not " + std::string(nameOf(product)));
  if (columns <= 0 || tile.size() % static_cast<size_t>(columns) != 0)
    throw std::invalid_argument("quantizeTile: columns must be positive and divide the tile's " +
                                std::to_string(tile.size()) + " values, got " + std::to_string(columns));
  std::vector<float> values(tile.size());
  std::transform(tile.begin(), tile.end(), values.begin(), [](double value) { return static_cast<float>(value); });
  if (int8 && spec.granularity == Granularity::per_block) {
    std::vector<int8_t> codes(tile.size());
    const float scale = numerics::quantizeInt8(values, codes);
    for (size_t i = 0; i < codes.size(); ++i)
      result[i] = static_cast<double>(codes[i]) * static_cast<double>(scale);
    return result;
  }
  // The operand quantizer on the tile as a rows x columns matrix: per_token is one scale per row (query token) for
  // dQ = dS.K, one per column (key token) for dV = P^T.dO and dK = dS^T.Q; per_block one for the whole tile.
  const int64_t rows = static_cast<int64_t>(tile.size()) / columns;
  QuantizerSpec operand = spec;
  operand.group_tokens = 0;
  if (spec.granularity == Granularity::per_token && product != BackwardProduct::dq)
    operand.granularity = Granularity::per_channel;
  return quantizeOperand(OperandMatrix{rows, columns, std::move(values)}, operand, rows);
}

GradientResult runBackwardReference(const BackwardVariant &variant, const HostTensor &q, const HostTensor &k,
                                    const HostTensor &v, const HostTensor &o, const HostTensor &d_o,
                                    std::span<const double> lse) {
  validateShapes(variant.head_dim, q, k, v, &o, d_o, &lse);
  require(variant.smooth_k != SmoothScope::block,
          "variant: K is smoothed over the sequence (one mean per KV head) or not at all, not per block");
  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens(), group = q.heads() / k.heads();
  const int64_t bq = variant.block_q, bkv = variant.block_kv;
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));
  const int64_t causal_offset = n_kv - n_q; // key j is visible to query i iff j <= i + offset
  const bool causal = variant.mask == MaskKind::causal;
  using P = BackwardProduct;
  const BackwardProductSpec &s_spec = variant.product(P::s), &dp_spec = variant.product(P::dp);
  const BackwardProductSpec &dv_spec = variant.product(P::dv), &dq_spec = variant.product(P::dq);
  const BackwardProductSpec &dk_spec = variant.product(P::dk);

  GradientResult result{q.batch(), q.heads(), k.heads(), n_q, n_kv, d, {}, {}, {}};
  result.dq.assign(static_cast<size_t>(q.batch() * q.heads() * n_q * d), 0.0);
  result.dk.assign(static_cast<size_t>(k.batch() * k.heads() * n_kv * d), 0.0);
  result.dv.assign(result.dk.size(), 0.0);

  const bool smooth_k = variant.smooth_k != SmoothScope::none;
  OperandCache q_cache(q, bq), k_cache(k, bkv, smooth_k, true), v_cache(v, bkv), do_cache(d_o, bq);
  std::vector<double> p_tile(static_cast<size_t>(bq * bkv)), ds_tile(p_tile.size());
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h_kv = 0; h_kv < k.heads(); ++h_kv) {
      k_cache.select(b, h_kv);
      v_cache.select(b, h_kv);
      const std::vector<double> &k_s = k_cache.values(s_spec.rhs), &k_dq = k_cache.values(dq_spec.rhs);
      const std::vector<double> &v_dp = v_cache.values(dp_spec.rhs);
      double *dk = &result.dk[index4(k.heads(), n_kv, d, b, h_kv, 0)];
      double *dv = &result.dv[index4(k.heads(), n_kv, d, b, h_kv, 0)];
      for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        q_cache.select(b, h);
        do_cache.select(b, h);
        const std::vector<double> &q_s = q_cache.values(s_spec.lhs), &q_dk = q_cache.values(dk_spec.rhs);
        const std::vector<double> &do_dp = do_cache.values(dp_spec.lhs), &do_dv = do_cache.values(dv_spec.rhs);
        const double *head_lse = &lse[static_cast<size_t>((b * q.heads() + h) * n_q)];
        double *dq = &result.dq[index4(q.heads(), n_q, d, b, h, 0)];
        // D = rowsum(dO o O), from the O the forward stored
        std::vector<double> delta(static_cast<size_t>(n_q), 0.0);
        for (int64_t i = 0; i < n_q; ++i)
          for (int64_t c = 0; c < d; ++c)
            delta[i] += static_cast<double>(d_o.at(b, h, i, c)) * o.at(b, h, i, c);
        // The LSE P is recomputed against: the forward's, or with K smoothed that of the smoothed scores
        // S_s = Q (K - mean(K))^T = S - q . mean(K), i.e. LSE - q . mean(K) / sqrt(d) (the caller's q)
        std::vector<double> row_lse(head_lse, head_lse + n_q);
        if (smooth_k)
          for (int64_t i = 0; i < n_q; ++i) {
            double shift = 0.0;
            for (int64_t c = 0; c < d; ++c)
              shift += static_cast<double>(q.at(b, h, i, c)) * k_cache.mean()[static_cast<size_t>(c)];
            row_lse[i] -= shift * softmax_scale; // -inf stays -inf
          }

        // FlashAttention-2's order: for each KV tile j, for each Q tile i
        for (int64_t kv_begin = 0; kv_begin < n_kv; kv_begin += bkv) {
          const int64_t columns = std::min(bkv, n_kv - kv_begin);
          for (int64_t q_begin = 0; q_begin < n_q; q_begin += bq) {
            const int64_t rows = std::min(bq, n_q - q_begin);
            if (causal && kv_begin > q_begin + rows - 1 + causal_offset)
              continue; // the whole tile lies above the diagonal
            // S = psi^-1(Q^ K^^T); P = exp(S / sqrt(d) - L); dP = dO V^T; dS = P o (dP - D). P and dS stay in
            // double here: an int8 (or f16/bf16) quantizeTile rounds them to f32 first, as the kernels' registers
            // hold them; exact-bwd's f32 "cast" keeps them (so its dQ identity below holds to double rounding).
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = q_begin + r;
              for (int64_t col = 0; col < columns; ++col) {
                const int64_t j = kv_begin + col;
                const bool masked = (causal && j > i + causal_offset) || head_lse[i] == kNegativeInfinity;
                const double p = masked ? 0.0 : std::exp(dot(&q_s[i * d], &k_s[j * d], d) * softmax_scale - row_lse[i]);
                const double dp = dot(&do_dp[i * d], &v_dp[j * d], d);
                p_tile[r * columns + col] = p;
                ds_tile[r * columns + col] = p * (dp - delta[i]);
              }
            }
            const size_t tile_size = static_cast<size_t>(rows * columns);
            const std::span<const double> p_values(p_tile.data(), tile_size), ds_values(ds_tile.data(), tile_size);
            const std::vector<double> p_dv = quantizeTile(p_values, columns, dv_spec.lhs, P::dv);
            const std::vector<double> ds_dq = quantizeTile(ds_values, columns, dq_spec.lhs, P::dq);
            const std::vector<double> ds_dk =
                dk_spec.lhs == dq_spec.lhs && dk_spec.lhs.granularity != Granularity::per_token
                    ? ds_dq
                    : quantizeTile(ds_values, columns, dk_spec.lhs, P::dk);
            // dV_j += P^T dO_i; dQ_i += dS K_j; dK_j += dS^T Q_i. With K smoothed dQ_i takes K_j - mean(K):
            // sum_j dS_ij (K_j - mean(K)) = sum_j dS_ij K_j, since sum_j dS_ij = sum_j P_ij dP_ij - D_i = 0.
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = q_begin + r;
              for (int64_t col = 0; col < columns; ++col) {
                const int64_t j = kv_begin + col;
                const double p = p_dv[r * columns + col], ds_q = ds_dq[r * columns + col];
                const double ds_k = ds_dk[r * columns + col];
                for (int64_t c = 0; c < d; ++c) {
                  dv[j * d + c] += p * do_dv[i * d + c];
                  dq[i * d + c] += ds_q * k_dq[j * d + c];
                  dk[j * d + c] += ds_k * q_dk[i * d + c];
                }
              }
            }
          }
        }
        for (int64_t e = 0; e < n_q * d; ++e)
          dq[e] *= softmax_scale; // dS is the gradient of S / sqrt(d)
      }
      for (int64_t e = 0; e < n_kv * d; ++e)
        dk[e] *= softmax_scale;
    }
  return result;
}

GradientResult runForwardBackwardReference(const AttentionVariant &forward, const BackwardVariant &backward,
                                           const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                           const HostTensor &d_o) {
  require(forward.epilogue.write_lse,
          "forward: the variant '" + forward.name + "' does not write the LSE, which the backward recomputes P from");
  require(forward.mask.kind == backward.mask, "backward: its mask '" + std::string(nameOf(backward.mask)) +
                                                  "' differs from the forward's '" +
                                                  std::string(nameOf(forward.mask.kind)) + "'");
  const AttentionResult result = runReference(forward, q, k, v);
  HostTensor o(q.batch(), q.heads(), q.tokens(), q.dim(), q.storage(), Layout::hnd);
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h = 0; h < q.heads(); ++h)
      for (int64_t t = 0; t < q.tokens(); ++t)
        for (int64_t c = 0; c < q.dim(); ++c)
          o.set(b, h, t, c, result.output[index4(q.heads(), q.tokens(), q.dim(), b, h, t) + static_cast<size_t>(c)]);
  return runBackwardReference(backward, q, k, v, o, d_o, result.lse);
}

GradientResult exactAttentionBackward(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                      const HostTensor &d_o, bool causal) {
  require(q.dim() > 0 && q.dim() <= kMaxHeadDim,
          "q: head dim " + std::to_string(q.dim()) + " must lie in [1, " + std::to_string(kMaxHeadDim) + "]");
  validateShapes(static_cast<int>(q.dim()), q, k, v, nullptr, d_o, nullptr);
  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens(), group = q.heads() / k.heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  GradientResult result{q.batch(), q.heads(), k.heads(), n_q, n_kv, d, {}, {}, {}};
  result.dq.assign(static_cast<size_t>(q.batch() * q.heads() * n_q * d), 0.0);
  result.dk.assign(static_cast<size_t>(k.batch() * k.heads() * n_kv * d), 0.0);
  result.dv.assign(result.dk.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(n_kv)), dp(static_cast<size_t>(n_kv));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h = 0; h < q.heads(); ++h) {
      const int64_t h_kv = h / group;
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = causal ? std::min(n_kv, i + (n_kv - n_q) + 1) : n_kv;
        if (visible <= 0)
          continue; // a fully masked row: O = 0 whatever Q, K, V are
        double max_logit = kNegativeInfinity;
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c)
            s += static_cast<double>(q.at(b, h, i, c)) * k.at(b, h_kv, j, c);
          p[j] = s * scale;
          max_logit = std::max(max_logit, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < visible; ++j)
          sum += (p[j] = std::exp(p[j] - max_logit));
        double delta = 0.0; // D_i = sum_j P_ij dP_ij (= dO_i . O_i)
        for (int64_t j = 0; j < visible; ++j) {
          p[j] /= sum;
          double value = 0.0;
          for (int64_t c = 0; c < d; ++c)
            value += static_cast<double>(d_o.at(b, h, i, c)) * v.at(b, h_kv, j, c);
          dp[j] = value;
          delta += p[j] * value;
        }
        double *dq = &result.dq[index4(q.heads(), n_q, d, b, h, i)];
        for (int64_t j = 0; j < visible; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          double *dk = &result.dk[index4(k.heads(), n_kv, d, b, h_kv, j)];
          double *dv = &result.dv[index4(k.heads(), n_kv, d, b, h_kv, j)];
          for (int64_t c = 0; c < d; ++c) {
            dq[c] += scale * ds * k.at(b, h_kv, j, c);
            dk[c] += scale * ds * q.at(b, h, i, c);
            dv[c] += p[j] * d_o.at(b, h, i, c);
          }
        }
      }
    }
  return result;
}

GradientAccuracy compareGradients(const GradientResult &reference, const GradientResult &candidate) {
  return {compareOutputs(reference.dq, candidate.dq), compareOutputs(reference.dk, candidate.dk),
          compareOutputs(reference.dv, candidate.dv)};
}

} // namespace sage::reference
