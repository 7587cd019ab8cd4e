// The CPU reference of packed variable-length batches (issue 28): every sequence is sliced out of the packed tensors
// and run alone, which is what a packed variant means (AttentionVariant::packed_sequences), so its statistics over the
// sequence (K smoothing, V's scales, Q's blocks, the causal alignment) cannot see another sequence's tokens.
#include "ReferenceChecks.h"
#include "sage/numerics/CheckedSize.h"
#include "sage/reference/Reference.h"

#include <cstddef>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>

namespace sage::reference {
namespace {

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

// One offset list (cu_seqlens): batch + 1 >= 2 entries, from 0, never decreasing, ending at the tensor's tokens.
void validateOffsets(std::span<const int64_t> offsets, int64_t tokens, const std::string &name,
                     std::string_view tensor) {
  require(offsets.size() >= 2, name +
                                   ": expected batch + 1 entries (at least 2: cumulative lengths starting at 0), "
                                   "got " +
                                   std::to_string(offsets.size()));
  require(offsets.front() == 0, name + ": must start at 0, got " + std::to_string(offsets.front()));
  for (size_t i = 1; i < offsets.size(); ++i)
    require(offsets[i] >= offsets[i - 1], name + ": must not decrease, but entry " + std::to_string(i) + " (" +
                                              std::to_string(offsets[i]) + ") is below entry " + std::to_string(i - 1) +
                                              " (" + std::to_string(offsets[i - 1]) + ")");
  require(offsets.back() == tokens, name + ": the last entry (" + std::to_string(offsets.back()) + ") must equal " +
                                        std::string(tensor) + "'s token count (" + std::to_string(tokens) + ")");
}

void validatePackedInputs(const AttentionVariant &dense, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                          std::span<const int64_t> cu_q, std::span<const int64_t> cu_kv) {
  for (auto [tensor, name, tokens] :
       {std::tuple{&q, "q", "total_q"}, std::tuple{&k, "k", "total_kv"}, std::tuple{&v, "v", "total_kv"}})
    require(tensor->batch() == 1, std::string(name) + ": a packed batch is one tensor [1, heads, " + tokens +
                                      ", d] (the sequences along its tokens), got batch " +
                                      std::to_string(tensor->batch()));
  detail::validateShapes(dense, q, k, v, nullptr);
  validateOffsets(cu_q, q.tokens(), "cu_seqlens_q", "q");
  validateOffsets(cu_kv, k.tokens(), "cu_seqlens_kv", "k");
  require(cu_kv.size() == cu_q.size(),
          "cu_seqlens_kv: expected as many entries as cu_seqlens_q (" + std::to_string(cu_q.size()) +
              ": one sequence of K/V per sequence of Q), got " + std::to_string(cu_kv.size()));
  // Memory as one dense run of the totals (an upper bound), work as the sum over the sequences.
  detail::checkReferenceMemory(1, q.heads(), k.heads(), q.tokens(), k.tokens(), q.dim());
  std::optional<int64_t> work = 0;
  for (size_t b = 0; b + 1 < cu_q.size() && work; ++b) {
    const auto sequence =
        numerics::checkedProduct({q.heads(), cu_q[b + 1] - cu_q[b], cu_kv[b + 1] - cu_kv[b], q.dim(), int64_t{2}});
    if (!sequence || __builtin_add_overflow(*work, *sequence, &*work))
      work = std::nullopt;
  }
  detail::checkReferenceWork(work, "the sum over sequences of heads x len_q x len_kv x d x 2");
}

// Tokens [begin, begin + count) of a [1, heads, tokens, dim] tensor as a tensor of their own (the same values).
HostTensor tokensOf(const HostTensor &tensor, int64_t begin, int64_t count) {
  HostTensor slice(1, tensor.heads(), count, tensor.dim(), tensor.storage(), tensor.layout());
  for (int64_t h = 0; h < tensor.heads(); ++h)
    for (int64_t t = 0; t < count; ++t)
      for (int64_t c = 0; c < tensor.dim(); ++c)
        slice.set(0, h, t, c, tensor.at(0, h, begin + t, c)); // already in the storage type: stored unchanged
  return slice;
}

// `run(q_b, k_b, v_b)` on every sequence with queries and keys, its rows placed at the sequence's rows of the packed
// result; the rows of a sequence without keys stay O = 0, LSE = -inf (fully masked).
template <typename Run>
AttentionResult perSequence(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                            std::span<const int64_t> cu_q, std::span<const int64_t> cu_kv, Run run) {
  const int64_t heads = q.heads(), total_q = q.tokens(), d = q.dim();
  AttentionResult result{1, heads, total_q, d, {}, {}};
  result.output.assign(static_cast<size_t>(heads * total_q * d), 0.0);
  result.lse.assign(static_cast<size_t>(heads * total_q), -std::numeric_limits<double>::infinity());
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int64_t q_begin = cu_q[b], length_q = cu_q[b + 1] - q_begin;
    const int64_t kv_begin = cu_kv[b], length_kv = cu_kv[b + 1] - kv_begin;
    if (length_q == 0 || length_kv == 0)
      continue;
    const AttentionResult part =
        run(tokensOf(q, q_begin, length_q), tokensOf(k, kv_begin, length_kv), tokensOf(v, kv_begin, length_kv));
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < length_q; ++t) {
        const size_t from = static_cast<size_t>(h * length_q + t), to = static_cast<size_t>(h * total_q + q_begin + t);
        result.lse[to] = part.lse[from];
        for (int64_t c = 0; c < d; ++c)
          result.output[to * d + c] = part.output[from * d + c];
      }
  }
  return result;
}

} // namespace

AttentionResult runPackedReference(const AttentionVariant &packed, const HostTensor &q, const HostTensor &k,
                                   const HostTensor &v, std::span<const int64_t> cu_seqlens_q,
                                   std::span<const int64_t> cu_seqlens_kv) {
  require(packed.packed_sequences, "variant: '" + packed.name +
                                       "' is dense (packed_sequences is not set): run it with runReference, or make "
                                       "it packed with packedSequencesOf");
  if (const std::string problem = packedSequencesProblem(packed.mask.kind, packed.sla.enabled); !problem.empty())
    throw std::invalid_argument("variant: '" + packed.name + "': " + problem);
  AttentionVariant dense = packed;
  dense.packed_sequences = false;
  validatePackedInputs(dense, q, k, v, cu_seqlens_q, cu_seqlens_kv);
  return perSequence(q, k, v, cu_seqlens_q, cu_seqlens_kv,
                     [&](const HostTensor &q_b, const HostTensor &k_b, const HostTensor &v_b) {
                       return runReference(dense, q_b, k_b, v_b);
                     });
}

AttentionResult exactPackedAttention(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                                     std::span<const int64_t> cu_seqlens_q, std::span<const int64_t> cu_seqlens_kv,
                                     bool causal) {
  require(q.dim() <= kMaxHeadDim, "q: head dim " + std::to_string(q.dim()) + " exceeds " + std::to_string(kMaxHeadDim));
  AttentionVariant shape_only;
  shape_only.head_dim = static_cast<int>(q.dim());
  validatePackedInputs(shape_only, q, k, v, cu_seqlens_q, cu_seqlens_kv);
  return perSequence(q, k, v, cu_seqlens_q, cu_seqlens_kv,
                     [&](const HostTensor &q_b, const HostTensor &k_b, const HostTensor &v_b) {
                       return exactAttention(q_b, k_b, v_b, causal);
                     });
}

} // namespace sage::reference
