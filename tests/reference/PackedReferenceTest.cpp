// The CPU reference of packed variable-length batches (issue 28): sequence b of a packed call is, bit for bit, the
// dense variant run on sequence b alone (K smoothing's mean, V's per-channel scales, Q's blocks and the causal
// alignment per sequence); empty sequences are legal; bad offsets are refused naming the argument.
#include "ReferenceTestSupport.h"
#include "sage/dsl/Presets.h"
#include "sage/reference/HostTensor.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using reference::HostTensor;
using reference::Layout;
using reference::StorageType;

namespace {

constexpr int64_t kDim = 64, kHeadsQ = 4, kHeadsKv = 2; // GQA: two query heads per KV head

// Sequence lengths: empty ones, a single token, lengths that are not multiples of any block, len_q > len_kv (causal
// rows with no key), a sequence of queries without keys, and keys without queries.
const std::vector<int64_t> kLengthsQ = {37, 0, 1, 130, 77, 20, 64};
const std::vector<int64_t> kLengthsKv = {37, 50, 1, 150, 200, 0, 33};

std::vector<int64_t> offsetsOf(const std::vector<int64_t> &lengths) {
  std::vector<int64_t> offsets = {0};
  for (int64_t length : lengths)
    offsets.push_back(offsets.back() + length);
  return offsets;
}

// One batch of sequences, built sequence by sequence and packed by the test itself (not by the code under test).
struct Batch {
  std::vector<HostTensor> q, k, v; // the non-empty sequences, [1, heads, len, d] each, in order
  HostTensor packed_q, packed_k, packed_v;
  std::vector<int64_t> cu_q, cu_kv;
};

HostTensor pack(const std::vector<HostTensor> &parts, const std::vector<int64_t> &lengths, int64_t heads) {
  const std::vector<int64_t> offsets = offsetsOf(lengths);
  HostTensor packed(1, heads, offsets.back(), kDim, StorageType::f16, Layout::hnd);
  size_t part = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] == 0)
      continue;
    const HostTensor &sequence = parts[part++];
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < lengths[b]; ++t)
        for (int64_t c = 0; c < kDim; ++c)
          packed.set(0, h, offsets[b] + t, c, sequence.at(0, h, t, c));
  }
  return packed;
}

// K of sequence b has per-channel offsets of its own (std 8, a different draw per sequence and head): what K smoothing
// removes, and what a mean over the whole packed K would get wrong.
Batch makeBatch(uint64_t seed, double k_bias_of_sequence_3 = 8.0) {
  std::vector<HostTensor> q, k, v;
  for (size_t b = 0; b < kLengthsQ.size(); ++b) {
    const uint64_t s = seed + 101 * b;
    if (kLengthsQ[b] > 0)
      q.push_back(reference::randomTensor(1, kHeadsQ, kLengthsQ[b], kDim, StorageType::f16, Layout::hnd, {s}));
    if (kLengthsKv[b] > 0) {
      k.push_back(reference_test::keysWithOffsets(kHeadsKv, kLengthsKv[b], kDim, StorageType::f16, s + 1,
                                                  b == 3 ? k_bias_of_sequence_3 : 8.0));
      v.push_back(reference::randomTensor(1, kHeadsKv, kLengthsKv[b], kDim, StorageType::f16, Layout::hnd,
                                          {s + 2, 0.0, 1.0, 2.0}));
    }
  }
  HostTensor packed_q = pack(q, kLengthsQ, kHeadsQ), packed_k = pack(k, kLengthsKv, kHeadsKv),
             packed_v = pack(v, kLengthsKv, kHeadsKv);
  return {std::move(q),        std::move(k),        std::move(v),         std::move(packed_q),
          std::move(packed_k), std::move(packed_v), offsetsOf(kLengthsQ), offsetsOf(kLengthsKv)};
}

// Rows of sequence b (all query heads) out of a packed result: O then the LSE, in [h][t][c] and [h][t] order.
std::vector<double> rowsOf(const reference::AttentionResult &result, const Batch &batch, size_t b, bool lse) {
  std::vector<double> rows;
  for (int64_t h = 0; h < kHeadsQ; ++h)
    for (int64_t t = batch.cu_q[b]; t < batch.cu_q[b + 1]; ++t) {
      const size_t row = static_cast<size_t>(h * result.tokens + t);
      if (lse)
        rows.push_back(result.lse[row]);
      else
        rows.insert(rows.end(), result.output.begin() + row * kDim, result.output.begin() + (row + 1) * kDim);
    }
  return rows;
}

AttentionVariant packedPreset(const char *name, MaskKind mask) {
  return dsl::preset(name, kDim, mask)->lse().packed_sequences().describe();
}

// Compares every sequence of the packed run with `dense_run` on that sequence alone, bit for bit.
template <typename DenseRun>
void checkPerSequence(const reference::AttentionResult &packed, const Batch &batch, DenseRun dense_run) {
  REQUIRE(packed.batch == 1);
  REQUIRE(packed.heads == kHeadsQ);
  REQUIRE(packed.tokens == batch.cu_q.back());
  size_t q_part = 0, kv_part = 0;
  for (size_t b = 0; b < kLengthsQ.size(); ++b) {
    CAPTURE(b);
    const bool has_q = kLengthsQ[b] > 0, has_kv = kLengthsKv[b] > 0;
    if (has_q && has_kv) {
      const reference::AttentionResult alone = dense_run(batch.q[q_part], batch.k[kv_part], batch.v[kv_part]);
      CHECK(rowsOf(packed, batch, b, false) == alone.output); // exact: the same doubles
      CHECK(rowsOf(packed, batch, b, true) == alone.lse);
    } else if (has_q) { // queries without keys: fully masked rows
      for (double value : rowsOf(packed, batch, b, false))
        CHECK(value == 0.0);
      for (double value : rowsOf(packed, batch, b, true))
        CHECK(value == -std::numeric_limits<double>::infinity());
    }
    q_part += has_q ? 1 : 0;
    kv_part += has_kv ? 1 : 0;
  }
}

} // namespace

TEST_CASE("a packed batch's sequence b is the dense variant on sequence b alone, bit for bit") {
  const Batch batch = makeBatch(11);
  for (const char *name : {"sage-b", "sage2-fp8", "sage-vb", "sage2-int4"})
    for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
      CAPTURE(std::string(name));
      CAPTURE(mask == MaskKind::causal);
      const AttentionVariant packed = packedPreset(name, mask);
      AttentionVariant dense = packed;
      dense.packed_sequences = false;
      const reference::AttentionResult result = reference::runPackedReference(packed, batch.packed_q, batch.packed_k,
                                                                              batch.packed_v, batch.cu_q, batch.cu_kv);
      checkPerSequence(result, batch, [&](const HostTensor &q, const HostTensor &k, const HostTensor &v) {
        return reference::runReference(dense, q, k, v);
      });
    }
}

TEST_CASE("the causal mask is aligned bottom-right per sequence") {
  const Batch batch = makeBatch(5);
  const reference::AttentionResult result = reference::runPackedReference(
      packedPreset("exact", MaskKind::causal), batch.packed_q, batch.packed_k, batch.packed_v, batch.cu_q, batch.cu_kv);
  // Sequence 6 has 64 queries and 33 keys: row i sees keys j <= i - 31, so its first 31 rows see nothing.
  const int64_t begin = batch.cu_q[6];
  for (int64_t h = 0; h < kHeadsQ; ++h)
    for (int64_t i = 0; i < kLengthsQ[6]; ++i) {
      CAPTURE(i);
      const double lse = result.lse[static_cast<size_t>(h * result.tokens + begin + i)];
      CHECK((i < 31) == (lse == -std::numeric_limits<double>::infinity()));
    }
  // Sequence 2 (one query, one key) sees its key: the output is that V row, as a dense 1 x 1 call gives it.
  CHECK(std::isfinite(result.lse[static_cast<size_t>(batch.cu_q[2])]));
}

TEST_CASE("K smoothing's mean is per sequence: another sequence's K offsets do not reach a sequence's output") {
  const AttentionVariant packed = packedPreset("sage-b", MaskKind::none);
  const Batch batch = makeBatch(23, 8.0), shifted = makeBatch(23, 64.0); // only sequence 3's K differs
  const auto run = [&](const Batch &b) {
    return reference::runPackedReference(packed, b.packed_q, b.packed_k, b.packed_v, b.cu_q, b.cu_kv);
  };
  const reference::AttentionResult first = run(batch), second = run(shifted);
  for (size_t b : {size_t{0}, size_t{4}, size_t{6}}) {
    CAPTURE(b);
    CHECK(rowsOf(first, batch, b, false) == rowsOf(second, shifted, b, false));
    CHECK(rowsOf(first, batch, b, true) == rowsOf(second, shifted, b, true));
  }
  CHECK(rowsOf(first, batch, 3, false) != rowsOf(second, shifted, 3, false));

  // A mean over the whole packed K (what a dense prologue over the packed tensor would subtract) changes every
  // sequence's int8 codes and so its output; the packed reference does not use it.
  const HostTensor &k_all = batch.packed_k;
  HostTensor k_globally_smoothed(1, kHeadsKv, k_all.tokens(), kDim, StorageType::f32, Layout::hnd);
  for (int64_t h = 0; h < kHeadsKv; ++h)
    for (int64_t c = 0; c < kDim; ++c) {
      double mean = 0.0;
      for (int64_t t = 0; t < k_all.tokens(); ++t)
        mean += k_all.at(0, h, t, c);
      mean /= static_cast<double>(k_all.tokens());
      for (int64_t t = 0; t < k_all.tokens(); ++t)
        k_globally_smoothed.set(0, h, t, c, k_all.at(0, h, t, c) - mean);
    }
  AttentionVariant no_smoothing = packed;
  no_smoothing.smooth_k = SmoothScope::none;
  no_smoothing.epilogue.lse_smoothing_correction = false;
  const reference::AttentionResult global = reference::runPackedReference(
      no_smoothing, batch.packed_q, k_globally_smoothed, batch.packed_v, batch.cu_q, batch.cu_kv);
  CHECK(rowsOf(first, batch, 0, false) != rowsOf(global, batch, 0, false));
  // ... and it is the worse model: against exact attention per sequence, the per-sequence mean is closer.
  const reference::AttentionResult exact =
      reference::exactPackedAttention(batch.packed_q, batch.packed_k, batch.packed_v, batch.cu_q, batch.cu_kv, false);
  CHECK(reference_test::maxAbsDifference(first.output, exact.output) <
        reference_test::maxAbsDifference(global.output, exact.output));
}

TEST_CASE("exactPackedAttention is exactAttention per sequence") {
  const Batch batch = makeBatch(3);
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const reference::AttentionResult packed = reference::exactPackedAttention(
        batch.packed_q, batch.packed_k, batch.packed_v, batch.cu_q, batch.cu_kv, causal);
    checkPerSequence(packed, batch, [&](const HostTensor &q, const HostTensor &k, const HostTensor &v) {
      return reference::exactAttention(q, k, v, causal);
    });
  }
}

TEST_CASE("packed and dense variants go to their own entry points") {
  const Batch batch = makeBatch(1);
  const AttentionVariant dense = dsl::preset("sage-b", kDim)->describe();
  CHECK_THROWS_WITH_AS(
      reference::runPackedReference(dense, batch.packed_q, batch.packed_k, batch.packed_v, batch.cu_q, batch.cu_kv),
      doctest::Contains("variant: 'sage-b' is dense (packed_sequences is not set): run it with "
                        "runReference"),
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      reference::runReference(packedSequencesOf(dense), batch.packed_q, batch.packed_k, batch.packed_v),
      doctest::Contains("runs on packed sequences: run it with runPackedReference"), std::invalid_argument);
  AttentionVariant block_sparse = packedSequencesOf(dense);
  block_sparse.mask.kind = MaskKind::block_sparse;
  CHECK_THROWS_WITH_AS(reference::runPackedReference(block_sparse, batch.packed_q, batch.packed_k, batch.packed_v,
                                                     batch.cu_q, batch.cu_kv),
                       doctest::Contains("block_sparse mask is given per dense batch entry"), std::invalid_argument);
}

TEST_CASE("bad offsets and shapes are refused, naming the argument") {
  const Batch batch = makeBatch(2);
  const AttentionVariant packed = packedPreset("sage-b", MaskKind::causal);
  const auto refuse = [&](std::vector<int64_t> cu_q, std::vector<int64_t> cu_kv, const std::string &message) {
    CAPTURE(message);
    CHECK_THROWS_WITH_AS(
        reference::runPackedReference(packed, batch.packed_q, batch.packed_k, batch.packed_v, cu_q, cu_kv),
        doctest::Contains(message.c_str()), std::invalid_argument);
  };
  const int64_t total_q = batch.cu_q.back(), total_kv = batch.cu_kv.back();
  refuse({total_q}, {total_kv}, "cu_seqlens_q: expected batch + 1 entries (at least 2");
  refuse({}, batch.cu_kv, "cu_seqlens_q: expected batch + 1 entries");
  refuse({3, total_q}, {0, total_kv}, "cu_seqlens_q: must start at 0, got 3");
  refuse({0, 50, 40, total_q}, {0, 10, 20, total_kv},
         "cu_seqlens_q: must not decrease, but entry 2 (40) is below "
         "entry 1 (50)");
  refuse({0, total_q - 1}, {0, total_kv},
         "cu_seqlens_q: the last entry (" + std::to_string(total_q - 1) + ") must equal q's token count (" +
             std::to_string(total_q) + ")");
  refuse({0, total_q}, {0, total_kv + 1}, "cu_seqlens_kv: the last entry");
  refuse({0, 10, total_q}, {0, total_kv}, "cu_seqlens_kv: expected as many entries as cu_seqlens_q (3");
  refuse({0, total_q}, {-1, total_kv}, "cu_seqlens_kv: must start at 0, got -1");

  const HostTensor batched_q = reference::randomTensor(2, kHeadsQ, 8, kDim, StorageType::f16, Layout::hnd, {});
  CHECK_THROWS_WITH_AS(reference::runPackedReference(packed, batched_q, batch.packed_k, batch.packed_v,
                                                     std::vector<int64_t>{0, 8}, batch.cu_kv),
                       doctest::Contains("q: a packed batch is one tensor [1, heads, total_q, d]"),
                       std::invalid_argument);
  const HostTensor odd_heads_q = reference::randomTensor(1, 3, total_q, kDim, StorageType::f16, Layout::hnd, {});
  CHECK_THROWS_WITH_AS(
      reference::runPackedReference(packed, odd_heads_q, batch.packed_k, batch.packed_v, batch.cu_q, batch.cu_kv),
      doctest::Contains("must be a multiple of heads_kv"), std::invalid_argument);
}
