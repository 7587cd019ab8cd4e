// The reference interpreter of an AttentionVariant: Algorithm 1 of the SageAttention paper, generalised
// to every quantizer, accumulator, smoothing and mask the IR can express.
#include "sage/reference/Reference.h"

#include "OperandQuantizer.h"
#include "PvAccumulator.h"
#include "ReferenceChecks.h"
#include "sage/numerics/CheckedSize.h"
#include "sage/numerics/Quantizers.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sage::reference {
namespace {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

// What Q's or K's quantizer quantizes: the (smoothed) operand, rotated along head_dim when the spec says so (issue 28;
// after smoothing, as the prologue does it). The scores' other uses of K (Q smoothing's GEMV) keep the unrotated one.
OperandMatrix rotated(const OperandMatrix &matrix, const QuantizerSpec &spec, bool for_k) {
  OperandMatrix result = matrix;
  if (spec.rotation_seed)
    rotateRows(result, *spec.rotation_seed, for_k);
  return result;
}

// K and V of one KV head after smoothing and quantization.
struct KvOperands {
  OperandMatrix k_smoothed;
  std::vector<double> k_values, v_values;
  std::vector<float> k_mean, v_mean; // empty when not smoothed
};

KvOperands prepareKv(const AttentionVariant &variant, const HostTensor &k, const HostTensor &v, int64_t b, int64_t h) {
  KvOperands kv;
  kv.k_smoothed = headMatrix(k, b, h);
  if (variant.smooth_k == SmoothScope::sequence) { // gamma(K) = K - mean(K)
    kv.k_mean = channelMean(kv.k_smoothed, 0, kv.k_smoothed.tokens);
    subtractRows(kv.k_smoothed, 0, kv.k_smoothed.tokens, kv.k_mean);
  }
  kv.k_values = quantizeOperand(rotated(kv.k_smoothed, variant.k, true), variant.k, variant.block_kv); // psi_K
  OperandMatrix v_matrix = headMatrix(v, b, h);
  if (variant.smooth_v == SmoothScope::sequence) {
    kv.v_mean = channelMean(v_matrix, 0, v_matrix.tokens);
    subtractRows(v_matrix, 0, v_matrix.tokens, kv.v_mean);
  }
  if (isMicroscale(variant.v.granularity)) {
    // V's microscales run along its tokens (the reduction axis of P.V): quantize V^T row by row.
    OperandMatrix transposed{v_matrix.dim, v_matrix.tokens, std::vector<float>(v_matrix.values.size())};
    for (int64_t t = 0; t < v_matrix.tokens; ++t)
      for (int64_t c = 0; c < v_matrix.dim; ++c)
        transposed.values[c * v_matrix.tokens + t] = v_matrix.at(t, c);
    const std::vector<double> values = quantizeOperand(transposed, variant.v, variant.block_kv);
    kv.v_values.resize(values.size());
    for (int64_t t = 0; t < v_matrix.tokens; ++t)
      for (int64_t c = 0; c < v_matrix.dim; ++c)
        kv.v_values[t * v_matrix.dim + c] = values[c * v_matrix.tokens + t];
    return kv;
  }
  kv.v_values = quantizeOperand(v_matrix, variant.v, variant.block_kv); // psi_V
  return kv;
}

struct QOperands {
  OperandMatrix original;                      // the caller's Q as f32
  std::vector<double> values;                  // psi_Q(Q) dequantized, in the scores' domain when the scale is folded
  std::vector<std::vector<float>> block_means; // Q smoothing: mean of each Q block (same domain)
};

QOperands prepareQ(const AttentionVariant &variant, const HostTensor &q, int64_t b, int64_t h, float folded_scale) {
  QOperands result;
  result.original = headMatrix(q, b, h);
  OperandMatrix x = result.original;
  if (variant.q.fold_softmax_scale)
    for (float &value : x.values)
      value = value * folded_scale; // one f32 multiply, fused into the quantization (paper 4.6)
  if (variant.smooth_q == SmoothScope::block)
    for (int64_t begin = 0; begin < x.tokens; begin += variant.block_q) {
      int64_t end = std::min(x.tokens, begin + variant.block_q);
      result.block_means.push_back(channelMean(x, begin, end));
      subtractRows(x, begin, end, result.block_means.back());
    }
  result.values = quantizeOperand(rotated(x, variant.q, false), variant.q, variant.block_q); // psi_Q
  return result;
}

bool keepBlock(const BlockMask *mask, int64_t b, int64_t h, int64_t heads, int64_t q_block, int64_t kv_block) {
  if (!mask)
    return true;
  return mask->keep[((b * heads + h) * mask->q_blocks + q_block) * mask->kv_blocks + kv_block] != 0;
}

} // namespace

namespace detail {

void validateShapes(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                    const BlockMask *block_mask) {
  require(!variant.sla.enabled,
          "variant: '" + variant.name + "' is an SLA variant: run it with runSlaReference (sage/reference/Sla.h)");
  require(q.dim() == variant.head_dim, "q: head dim " + std::to_string(q.dim()) + " does not match the variant's " +
                                           std::to_string(variant.head_dim));
  require(k.dim() == q.dim() && v.dim() == q.dim(), "k, v: head dims must equal q's (" + std::to_string(q.dim()) + ")");
  require(k.batch() == q.batch() && v.batch() == q.batch(), "k, v: batch must equal q's");
  require(v.heads() == k.heads(), "v: must have as many heads as k");
  require(k.heads() > 0 && q.heads() % k.heads() == 0, "q: heads_q (" + std::to_string(q.heads()) +
                                                           ") must be a multiple of heads_kv (" +
                                                           std::to_string(k.heads()) + ") for grouped-query attention");
  require(v.tokens() == k.tokens(), "v: must have as many tokens as k");
  require(q.tokens() > 0 && k.tokens() > 0, "q, k: need at least one token");
  if (variant.mask.kind == MaskKind::block_sparse) {
    require(block_mask != nullptr, "block_mask: the variant is block_sparse and needs a block mask");
    int64_t q_blocks = (q.tokens() + variant.block_q - 1) / variant.block_q;
    int64_t kv_blocks = (k.tokens() + variant.block_kv - 1) / variant.block_kv;
    require(block_mask->q_blocks == q_blocks && block_mask->kv_blocks == kv_blocks &&
                static_cast<int64_t>(block_mask->keep.size()) == q.batch() * q.heads() * q_blocks * kv_blocks,
            "block_mask: expected [batch, heads_q, " + std::to_string(q_blocks) + ", " + std::to_string(kv_blocks) +
                "] entries");
  }
}

void checkReferenceMemory(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t n_q, int64_t n_kv, int64_t d) {
  using numerics::checkedProduct;
  const auto q_elements = checkedProduct({batch, heads_q, n_q, d});
  const auto kv_elements = checkedProduct({batch, heads_kv, n_kv, d});
  std::optional<int64_t> bytes;
  if (q_elements && kv_elements && *q_elements <= kMaxReferenceBytes && *kv_elements <= kMaxReferenceBytes) {
    const auto working = checkedProduct({8, n_q + 2 * n_kv, d});
    if (working && *working <= kMaxReferenceBytes)
      bytes = 4 * (*q_elements + 2 * *kv_elements) + 16 * *q_elements + *working;
  }
  if (!bytes || *bytes > kMaxReferenceBytes)
    throw std::invalid_argument(
        "the CPU reference would need " +
        (bytes ? std::to_string(*bytes / (int64_t(1) << 20)) + " MiB" : std::string("more than 2^63 bytes")) +
        " of memory for batch " + std::to_string(batch) + ", heads " + std::to_string(heads_q) + "/" +
        std::to_string(heads_kv) + ", n_q " + std::to_string(n_q) + ", n_kv " + std::to_string(n_kv) + ", d " +
        std::to_string(d) + "; the limit is " + std::to_string(kMaxReferenceBytes >> 30) + " GiB");
}

void checkReferenceWork(std::optional<int64_t> multiply_adds, std::string_view formula) {
  if (!multiply_adds || *multiply_adds > kMaxReferenceWork)
    throw std::invalid_argument("the CPU reference would do " +
                                (multiply_adds ? std::to_string(*multiply_adds) : std::string("more than 2^63")) +
                                " multiply-adds (" + std::string(formula) +
                                "); the limit is 2^38 = " + std::to_string(kMaxReferenceWork));
}

} // namespace detail

void checkReferenceShape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t n_q, int64_t n_kv, int64_t d) {
  detail::checkReferenceMemory(batch, heads_q, heads_kv, n_q, n_kv, d);
  detail::checkReferenceWork(numerics::checkedProduct({batch, heads_q, n_q, n_kv, d, 2}),
                             "batch x heads x n_q x n_kv x d x 2");
}

AttentionResult runReference(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                             const HostTensor &v, const BlockMask *block_mask) {
  if (variant.packed_sequences)
    throw std::invalid_argument("variant: '" + variant.name +
                                "' runs on packed sequences: run it with runPackedReference and the cu_seqlens");
  detail::validateShapes(variant, q, k, v, block_mask);
  checkReferenceShape(q.batch(), q.heads(), k.heads(), q.tokens(), k.tokens(), q.dim());
  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens();
  const int64_t group = q.heads() / k.heads();
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double exp_base_factor = variant.exp2_softmax ? kLog2e : 1.0;
  const float folded_scale = static_cast<float>(softmax_scale * exp_base_factor);
  // With the scale folded into Q, S is already in the exponent's domain; otherwise scale it here.
  const double score_scale = variant.q.fold_softmax_scale ? 1.0 : softmax_scale * exp_base_factor;
  const int64_t causal_offset = n_kv - n_q; // bottom-right aligned: key j is visible to query i iff j <= i + offset
  const bool causal = variant.mask.kind == MaskKind::causal;
  const BlockMask *mask = variant.mask.kind == MaskKind::block_sparse ? block_mask : nullptr;

  AttentionResult result{q.batch(), q.heads(), n_q, d, {}, {}};
  result.output.assign(static_cast<size_t>(q.batch() * q.heads() * n_q * d), 0.0);
  result.lse.assign(static_cast<size_t>(q.batch() * q.heads() * n_q), kNegativeInfinity);

  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h_kv = 0; h_kv < k.heads(); ++h_kv) {
      const KvOperands kv = prepareKv(variant, k, v, b, h_kv);
      for (int64_t h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        const QOperands qo = prepareQ(variant, q, b, h, folded_scale);
        for (int64_t q_begin = 0, q_block = 0; q_begin < n_q; q_begin += variant.block_q, ++q_block) {
          const int64_t q_end = std::min(n_q, q_begin + variant.block_q);
          const int64_t rows = q_end - q_begin;
          std::vector<double> m(rows, kNegativeInfinity), l(rows, 0.0);
          PvAccumulator accumulator(variant.accumulation, rows, d);
          std::vector<double> scores(static_cast<size_t>(variant.block_kv)), probabilities;

          for (int64_t kv_begin = 0, kv_block = 0; kv_begin < n_kv; kv_begin += variant.block_kv, ++kv_block) {
            const int64_t kv_end = std::min(n_kv, kv_begin + variant.block_kv);
            const int64_t columns = kv_end - kv_begin;
            if (!keepBlock(mask, b, h, q.heads(), q_block, kv_block))
              continue;
            if (causal && kv_begin > q_end - 1 + causal_offset)
              break; // every later block lies above the diagonal
            accumulator.beginBlock();
            for (int64_t r = 0; r < rows; ++r) {
              const int64_t i = q_begin + r;
              // S_i^j = psi^-1(Q^_i K^_j^T) (+ mean(Q_block) K^T when Q is smoothed)
              double row_max = kNegativeInfinity;
              for (int64_t col = 0; col < columns; ++col) {
                const int64_t j = kv_begin + col;
                double s = dot(&qo.values[i * d], &kv.k_values[j * d], d);
                if (!qo.block_means.empty()) // the GEMV of sage.q_mean_correction, in Q's (scaled) domain
                  for (int64_t c = 0; c < d; ++c)
                    s += static_cast<double>(qo.block_means[i / variant.block_q][c]) * kv.k_smoothed.at(j, c);
                s *= score_scale;
                if (causal && j > i + causal_offset)
                  s = kNegativeInfinity;
                scores[col] = s;
                row_max = std::max(row_max, s);
              }
              // m_i^j = max(m_i^{j-1}, rowmax(S_i^j)); P~ = exp(S - m); l_i^j = e^{m^{j-1} - m^j} l + rowsum(P~)
              const double m_new = std::max(m[r], row_max);
              if (m_new == kNegativeInfinity) {
                accumulator.skipRow(r);
                continue;
              }
              const double alpha = variant.exp2_softmax ? std::exp2(m[r] - m_new) : std::exp(m[r] - m_new);
              probabilities.assign(static_cast<size_t>(columns), 0.0);
              double row_sum = 0.0;
              for (int64_t col = 0; col < columns; ++col) {
                double p = variant.exp2_softmax ? std::exp2(scores[col] - m_new) : std::exp(scores[col] - m_new);
                probabilities[col] = p;
                row_sum += p;
              }
              l[r] = alpha * l[r] + row_sum;
              m[r] = m_new;
              quantizeProbabilities(probabilities, variant.p); // psi_P(P~), or its f16 cast
              // O_i^j = diag(alpha) O_i^{j-1} + P~ V_j, in the variant's accumulator
              accumulator.accumulateRow(r, alpha, probabilities, &kv.v_values[kv_begin * d]);
            }
            accumulator.endBlock();
          }

          // Epilogue: O_i = diag(l)^-1 O_i (+ mean(V)), LSE = m + log(l) (+ q.mean(K) / sqrt(d))
          const std::vector<double> output = accumulator.finish();
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = q_begin + r;
            const size_t row_index = static_cast<size_t>((b * q.heads() + h) * n_q + i);
            if (l[r] == 0.0)
              continue; // fully masked row: O = 0, LSE = -inf
            for (int64_t c = 0; c < d; ++c) {
              double value = output[r * d + c] / l[r];
              if (!kv.v_mean.empty())
                value += kv.v_mean[c];
              result.output[row_index * d + c] = value;
            }
            double lse = variant.exp2_softmax ? (m[r] + std::log2(l[r])) * kLn2 : m[r] + std::log(l[r]);
            if (variant.epilogue.lse_smoothing_correction && !kv.k_mean.empty()) {
              double correction = 0.0;
              for (int64_t c = 0; c < d; ++c)
                correction += static_cast<double>(qo.original.at(i, c)) * kv.k_mean[c];
              lse += correction * softmax_scale;
            }
            result.lse[row_index] = lse;
          }
        }
      }
    }
  return result;
}

AttentionResult exactAttention(const HostTensor &q, const HostTensor &k, const HostTensor &v, bool causal) {
  checkReferenceShape(q.batch(), q.heads(), k.heads(), q.tokens(), k.tokens(), q.dim());
  if (q.dim() > kMaxHeadDim)
    throw std::invalid_argument("q: head dim " + std::to_string(q.dim()) + " exceeds " + std::to_string(kMaxHeadDim));
  AttentionVariant shape_only;
  shape_only.head_dim = static_cast<int>(q.dim());
  detail::validateShapes(shape_only, q, k, v, nullptr);
  const int64_t d = q.dim(), n_q = q.tokens(), n_kv = k.tokens(), group = q.heads() / k.heads();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  AttentionResult result{q.batch(), q.heads(), n_q, d, {}, {}};
  result.output.assign(static_cast<size_t>(q.batch() * q.heads() * n_q * d), 0.0);
  result.lse.assign(static_cast<size_t>(q.batch() * q.heads() * n_q), kNegativeInfinity);
  std::vector<double> logits(static_cast<size_t>(n_kv));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h = 0; h < q.heads(); ++h)
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = causal ? std::min(n_kv, i + (n_kv - n_q) + 1) : n_kv;
        if (visible <= 0)
          continue;
        double max_logit = kNegativeInfinity;
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c)
            s += static_cast<double>(q.at(b, h, i, c)) * k.at(b, h / group, j, c);
          logits[j] = s * scale;
          max_logit = std::max(max_logit, logits[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < visible; ++j)
          sum += std::exp(logits[j] - max_logit);
        const size_t row_index = static_cast<size_t>((b * q.heads() + h) * n_q + i);
        for (int64_t c = 0; c < d; ++c) {
          double value = 0.0;
          for (int64_t j = 0; j < visible; ++j)
            value += std::exp(logits[j] - max_logit) * v.at(b, h / group, j, c);
          result.output[row_index * d + c] = value / sum;
        }
        result.lse[row_index] = max_logit + std::log(sum);
      }
  return result;
}

} // namespace sage::reference
