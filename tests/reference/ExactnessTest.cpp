// The interpreter's tiling, masks, layouts and GQA are exact: the `exact` preset must equal a plain,
// untiled fp64 softmax attention to 1e-12, whatever the shapes.
#include "sage/dsl/Presets.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

using namespace sage;
using namespace sage::reference;

namespace {

struct Shape {
  int64_t batch, heads_q, heads_kv, tokens_q, tokens_kv, dim;
  StorageType storage;
  Layout layout;
  bool causal;
};

struct Inputs {
  HostTensor q, k, v;
};

Inputs makeInputs(const Shape &shape, uint64_t seed) {
  return {
      randomTensor(shape.batch, shape.heads_q, shape.tokens_q, shape.dim, shape.storage, shape.layout, {seed}),
      randomTensor(shape.batch, shape.heads_kv, shape.tokens_kv, shape.dim, shape.storage, shape.layout, {seed + 1}),
      randomTensor(shape.batch, shape.heads_kv, shape.tokens_kv, shape.dim, shape.storage, shape.layout, {seed + 2})};
}

double maxAbsDifference(const std::vector<double> &a, const std::vector<double> &b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) && a[i] == b[i])
      continue;
    worst = std::max(worst, std::fabs(a[i] - b[i]));
  }
  return worst;
}

} // namespace

TEST_CASE("exact preset equals plain fp64 attention to 1e-12") {
  const Shape shapes[] = {
      {1, 2, 2, 200, 200, 64, StorageType::f32, Layout::hnd, false}, // partial tiles
      {2, 4, 2, 130, 70, 64, StorageType::f16, Layout::nhd, false},  // GQA, NHD, n_q != n_kv
      {1, 3, 1, 96, 300, 128, StorageType::bf16, Layout::hnd, true}, // causal, n_q < n_kv (bottom-right)
      {1, 2, 1, 300, 100, 32, StorageType::f16, Layout::nhd, true},  // causal, n_q > n_kv: masked rows
  };
  for (const Shape &shape : shapes) {
    CAPTURE(shape.tokens_q);
    CAPTURE(shape.tokens_kv);
    const Inputs inputs = makeInputs(shape, 7);
    const AttentionVariant variant =
        dsl::preset("exact", static_cast<int>(shape.dim), shape.causal ? MaskKind::causal : MaskKind::none)
            ->lse()
            .describe();
    const AttentionResult tiled = runReference(variant, inputs.q, inputs.k, inputs.v);
    const AttentionResult plain = exactAttention(inputs.q, inputs.k, inputs.v, shape.causal);
    CHECK(maxAbsDifference(tiled.output, plain.output) < 1e-12);
    CHECK(maxAbsDifference(tiled.lse, plain.lse) < 1e-12);
  }
}

TEST_CASE("rows that see no key (causal, n_q > n_kv) give O = 0 and LSE = -inf") {
  const Shape shape{1, 1, 1, 40, 8, 16, StorageType::f32, Layout::hnd, true};
  const Inputs inputs = makeInputs(shape, 3);
  const AttentionResult result =
      runReference(dsl::preset("sage-b", 16, MaskKind::causal)->lse().describe(), inputs.q, inputs.k, inputs.v);
  // offset = 8 - 40 = -32: query i sees keys j <= i - 32, so rows 0..31 see nothing.
  for (int64_t i = 0; i < 32; ++i) {
    CHECK(std::isinf(result.lse[i]));
    CHECK(result.output[i * 16] == 0.0);
  }
  CHECK(std::isfinite(result.lse[32]));
}

TEST_CASE("HND and NHD layouts give identical results") {
  Shape shape{2, 2, 1, 150, 150, 64, StorageType::f16, Layout::hnd, false};
  const Inputs hnd = makeInputs(shape, 11);
  shape.layout = Layout::nhd;
  const Inputs nhd = makeInputs(shape, 11);
  const AttentionVariant variant = dsl::preset("sage-b", 64)->describe();
  CHECK(runReference(variant, hnd.q, hnd.k, hnd.v).output == runReference(variant, nhd.q, nhd.k, nhd.v).output);
}

TEST_CASE("GQA equals repeating K and V for every query head") {
  const Shape grouped{1, 4, 2, 64, 64, 32, StorageType::f16, Layout::hnd, false};
  const Inputs inputs = makeInputs(grouped, 5);
  HostTensor k_repeated(1, 4, 64, 32, StorageType::f16, Layout::hnd),
      v_repeated(1, 4, 64, 32, StorageType::f16, Layout::hnd);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t t = 0; t < 64; ++t)
      for (int64_t c = 0; c < 32; ++c) {
        k_repeated.set(0, h, t, c, inputs.k.at(0, h / 2, t, c));
        v_repeated.set(0, h, t, c, inputs.v.at(0, h / 2, t, c));
      }
  const AttentionVariant variant = dsl::preset("sage-vt", 32, MaskKind::causal)->describe();
  CHECK(runReference(variant, inputs.q, inputs.k, inputs.v).output ==
        runReference(variant, inputs.q, k_repeated, v_repeated).output);
}

TEST_CASE("block-sparse masks") {
  const Shape shape{1, 2, 2, 256, 256, 64, StorageType::f16, Layout::hnd, false};
  const Inputs inputs = makeInputs(shape, 9);
  const AttentionVariant dense = dsl::preset("sage-b", 64)->lse().describe();
  AttentionVariant sparse = dense;
  sparse.mask.kind = MaskKind::block_sparse;
  BlockMask all{2, 4, std::vector<uint8_t>(2 * 2 * 4, 1)};
  CHECK(runReference(sparse, inputs.q, inputs.k, inputs.v, &all).output ==
        runReference(dense, inputs.q, inputs.k, inputs.v).output);

  BlockMask none_for_first_block = all;
  std::fill(none_for_first_block.keep.begin(), none_for_first_block.keep.begin() + 4, 0); // head 0, q block 0
  const AttentionResult result = runReference(sparse, inputs.q, inputs.k, inputs.v, &none_for_first_block);
  CHECK(std::isinf(result.lse[0]));
  CHECK(std::isinf(result.lse[127]));
  CHECK(std::isfinite(result.lse[128]));

  CHECK_THROWS_WITH_AS(runReference(sparse, inputs.q, inputs.k, inputs.v), doctest::Contains("block_mask"),
                       std::invalid_argument);
  BlockMask wrong{1, 4, std::vector<uint8_t>(8, 1)};
  CHECK_THROWS_WITH_AS(runReference(sparse, inputs.q, inputs.k, inputs.v, &wrong),
                       doctest::Contains("block_mask: expected [batch, heads_q, 2, 4]"), std::invalid_argument);
}

TEST_CASE("shape mistakes name the argument") {
  const Inputs inputs = makeInputs({1, 3, 2, 16, 16, 64, StorageType::f16, Layout::hnd, false}, 1);
  const AttentionVariant variant = dsl::preset("sage-b", 64)->describe();
  CHECK_THROWS_WITH_AS(runReference(variant, inputs.q, inputs.k, inputs.v), doctest::Contains("heads_q (3)"),
                       std::invalid_argument);
  const AttentionVariant wrong_dim = dsl::preset("sage-b", 128)->describe();
  const Inputs fine = makeInputs({1, 2, 2, 16, 16, 64, StorageType::f16, Layout::hnd, false}, 1);
  CHECK_THROWS_WITH_AS(runReference(wrong_dim, fine.q, fine.k, fine.v), doctest::Contains("q: head dim 64"),
                       std::invalid_argument);
}

TEST_CASE("Q smoothing with its GEMV correction is exact without quantization, folded scale or not") {
  const Shape shape{1, 2, 2, 200, 150, 64, StorageType::f16, Layout::hnd, false};
  const Inputs in = makeInputs(shape, 17);
  const AttentionResult truth = exactAttention(in.q, in.k, in.v, false);
  for (bool fold : {false, true}) {
    CAPTURE(fold);
    // f32 Q and K minus each Q block's mean, plus mean(Q_i) . K^T: only f32 rounding of Q - mean separates it from
    // exact attention (so the GEMV must be scaled like the scores when the scale is not folded into Q).
    AttentionVariant variant = dsl::preset("exact", 64)->qk(dsl::full_precision().smooth_q()).describe();
    variant.q.fold_softmax_scale = fold;
    const AttentionResult smoothed = runReference(variant, in.q, in.k, in.v);
    CHECK(maxAbsDifference(smoothed.output, truth.output) < 1e-5);
  }
}
