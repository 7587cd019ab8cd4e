// The backward reference (SageBwd, issue 12): the tile quantizer is the bit-exact int8 one, the exact gradients
// match finite differences, the exact-bwd program reproduces them through the tiled path (causal, GQA, partial
// tiles), and SageBwd meets the accuracy targets on N(0,1) data. K smoothing (issue 25): dQ from the smoothed
// K equals dQ from K (dS's rows sum to zero) to double rounding, and it repairs the gradients on K with per-channel
// offsets, with Q outlier channels too, where the ablation without it falls apart.
#include "sage/reference/Backward.h"
#include "ReferenceTestSupport.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace sage;
using namespace sage::reference;
using namespace sage::reference_test;

namespace {

HostTensor randomHnd(int64_t heads, int64_t tokens, int64_t dim, StorageType storage, uint64_t seed) {
  return randomTensor(1, heads, tokens, dim, storage, Layout::hnd, {seed});
}

// L = sum(O o G): its gradient with respect to O is G, so dO = G.
double loss(const HostTensor &q, const HostTensor &k, const HostTensor &v, const HostTensor &g, bool causal) {
  const AttentionResult result = exactAttention(q, k, v, causal);
  double sum = 0.0;
  for (int64_t h = 0; h < q.heads(); ++h)
    for (int64_t t = 0; t < q.tokens(); ++t)
      for (int64_t c = 0; c < q.dim(); ++c)
        sum += result.output[static_cast<size_t>((h * q.tokens() + t) * q.dim() + c)] * g.at(0, h, t, c);
  return sum;
}

// Central differences of L over every element of `tensor` (one of q, k, v), compared with `gradient`.
void checkAgainstFiniteDifferences(HostTensor &tensor, const std::vector<double> &gradient, const HostTensor &q,
                                   const HostTensor &k, const HostTensor &v, const HostTensor &g, bool causal) {
  for (int64_t h = 0; h < tensor.heads(); ++h)
    for (int64_t t = 0; t < tensor.tokens(); ++t)
      for (int64_t c = 0; c < tensor.dim(); ++c) {
        const float original = tensor.at(0, h, t, c);
        tensor.set(0, h, t, c, original + 1e-2);
        const double up_at = tensor.at(0, h, t, c);
        const double up = loss(q, k, v, g, causal);
        tensor.set(0, h, t, c, original - 1e-2);
        const double down_at = tensor.at(0, h, t, c);
        const double down = loss(q, k, v, g, causal);
        tensor.set(0, h, t, c, original);
        const double numeric = (up - down) / (up_at - down_at); // the f32 steps actually taken
        const double analytic = gradient[static_cast<size_t>((h * tensor.tokens() + t) * tensor.dim() + c)];
        CHECK_MESSAGE(std::fabs(numeric - analytic) <= 1e-4 + 1e-3 * std::fabs(analytic),
                      "element (" << h << ", " << t << ", " << c << "): finite difference " << numeric << ", gradient "
                                  << analytic);
      }
}

GradientAccuracy sagebwdAccuracy(const GradientResult &exact, const HostTensor &q, const HostTensor &k,
                                 const HostTensor &v, const HostTensor &d_o, MaskKind mask, bool smooth_k) {
  const int dim = static_cast<int>(q.dim());
  const ElementType type = q.storage() == StorageType::bf16 ? ElementType::bf16 : ElementType::f16;
  const AttentionVariant forward = dsl::preset("sagebwd", dim, mask)->describe();
  const BackwardVariant backward =
      dsl::backwardPreset("sagebwd", dim, mask)->float_type(type).smooth_k(smooth_k).describe();
  return compareGradients(exact, runForwardBackwardReference(forward, backward, q, k, v, d_o));
}

} // namespace

TEST_CASE("P and dS tiles: one int8 scale per tile, bit-exact with numerics::quantizeInt8") {
  const std::vector<double> tile = {0.5, -1.0, 0.25, 0.0, 0.1234567, -0.75};
  QuantizerSpec int8_tile{ElementType::int8, Granularity::per_block};
  const std::vector<double> quantized = quantizeTile(tile, 3, int8_tile, BackwardProduct::dv);
  std::vector<float> values(tile.begin(), tile.end());
  std::vector<int8_t> codes(tile.size());
  const float scale = numerics::quantizeInt8(values, codes);
  CHECK(scale == 1.0f / 127.0f);
  CHECK(codes[0] == 64); // 63.5 rounds half to even
  CHECK(codes[1] == -127);
  for (size_t i = 0; i < tile.size(); ++i)
    CHECK(quantized[i] == static_cast<double>(codes[i]) * static_cast<double>(scale));
  // Casts: f32 keeps the value, f16 rounds it.
  CHECK(quantizeTile(tile, 3, QuantizerSpec{ElementType::f32}, BackwardProduct::dv)[4] == tile[4]);
  CHECK(quantizeTile(tile, 3, QuantizerSpec{ElementType::f16}, BackwardProduct::dv)[4] ==
        static_cast<double>(numerics::roundToHalf(tile[4])));
  CHECK_THROWS_WITH_AS(
      quantizeTile(tile, 3, QuantizerSpec{ElementType::int8, Granularity::per_channel}, BackwardProduct::dv),
      doctest::Contains("one scale per tile"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(quantizeTile(tile, 4, int8_tile, BackwardProduct::dv), doctest::Contains("columns"),
                       std::invalid_argument);
}

TEST_CASE("P and dS tiles per_token: one int8 scale per key for dV and dK, per query for dQ") {
  // 2 query rows x 3 key columns; the largest |x| of each key column and of each query row is what 127 encodes.
  const std::vector<double> tile = {0.5, -0.01, 0.001, 0.25, 0.02, -0.004};
  const QuantizerSpec per_token{ElementType::int8, Granularity::per_token};
  for (BackwardProduct product : {BackwardProduct::dv, BackwardProduct::dk}) {
    const std::vector<double> by_key = quantizeTile(tile, 3, per_token, product);
    CHECK(by_key[0] == doctest::Approx(0.5).epsilon(1e-7));    // 127 x (0.5 / 127)
    CHECK(by_key[4] == doctest::Approx(0.02).epsilon(1e-7));   // column 1's largest
    CHECK(by_key[5] == doctest::Approx(-0.004).epsilon(1e-7)); // column 2's largest
    CHECK(by_key[2] == doctest::Approx(0.001).epsilon(1e-2));  // 31.75 -> 32 steps of 0.004 / 127
    CHECK(by_key[1] == doctest::Approx(-0.01).epsilon(1e-2));
  }
  const std::vector<double> by_query = quantizeTile(tile, 3, per_token, BackwardProduct::dq);
  CHECK(by_query[0] == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(by_query[3] == doctest::Approx(0.25).epsilon(1e-7));
  CHECK(by_query[2] == 0.0); // 0.001 is below half a step of 0.5 / 127 in its row
  CHECK(std::abs(by_query[5] - (-0.004)) <= 0.25 / 127 / 2);
  // One scale for the whole tile loses what a key column's own scale keeps.
  const std::vector<double> by_tile =
      quantizeTile(tile, 3, QuantizerSpec{ElementType::int8, Granularity::per_block}, BackwardProduct::dv);
  CHECK(by_tile[2] == 0.0);
  CHECK_THROWS_WITH_AS(quantizeTile(tile, 3, per_token, BackwardProduct::s), doctest::Contains("dV, dQ or dK"),
                       std::invalid_argument);
}

TEST_CASE("the exact gradients match finite differences (GQA, causal with n_q < n_kv)") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    HostTensor q = randomHnd(2, 5, 16, StorageType::f32, 11);
    HostTensor k = randomHnd(1, 7, 16, StorageType::f32, 12);
    HostTensor v = randomHnd(1, 7, 16, StorageType::f32, 13);
    const HostTensor g = randomHnd(2, 5, 16, StorageType::f32, 14);
    const GradientResult gradients = exactAttentionBackward(q, k, v, g, causal);
    checkAgainstFiniteDifferences(q, gradients.dq, q, k, v, g, causal);
    checkAgainstFiniteDifferences(k, gradients.dk, q, k, v, g, causal);
    checkAgainstFiniteDifferences(v, gradients.dv, q, k, v, g, causal);
  }
}

TEST_CASE("the exact-bwd program through the tiled reference reproduces the exact gradients") {
  // Partial tiles (100 and 150 tokens over 64-token tiles), GQA 4:2, bottom-right causal with n_q < n_kv.
  for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
    CAPTURE(nameOf(mask));
    const HostTensor q = randomHnd(4, 100, 64, StorageType::f32, 21);
    const HostTensor k = randomHnd(2, 150, 64, StorageType::f32, 22);
    const HostTensor v = randomHnd(2, 150, 64, StorageType::f32, 23);
    const HostTensor d_o = randomHnd(4, 100, 64, StorageType::f32, 24);
    AttentionVariant forward = dsl::preset("exact", 64, mask)->lse().describe();
    const BackwardVariant backward = dsl::backwardPreset("exact-bwd", 64, mask)->describe();
    const GradientResult tiled = runForwardBackwardReference(forward, backward, q, k, v, d_o);
    const GradientResult exact = exactAttentionBackward(q, k, v, d_o, mask == MaskKind::causal);
    // The only rounding: O stored in f32 before D = rowsum(dO o O).
    CHECK(maxAbsDifference(tiled.dq, exact.dq) <= 1e-5 * maxAbs(exact.dq));
    CHECK(maxAbsDifference(tiled.dk, exact.dk) <= 1e-5 * maxAbs(exact.dk));
    CHECK(maxAbsDifference(tiled.dv, exact.dv) <= 1e-5 * maxAbs(exact.dv));
    CHECK(maxAbs(exact.dk) > 0.0);
  }
}

TEST_CASE("SageBwd's accuracy targets on N(0,1) data (issue 12)") {
  // The shape is N = 1024, d = 128 (`sagegen reference-backward` prints it); the default suite runs the
  // same algorithm at N = 512 to stay fast. The bounds are the issue's.
  const int64_t tokens = 512, dim = 128;
  const HostTensor q = randomHnd(1, tokens, dim, StorageType::f16, 31);
  const HostTensor k = randomHnd(1, tokens, dim, StorageType::f16, 32);
  const HostTensor v = randomHnd(1, tokens, dim, StorageType::f16, 33);
  const HostTensor d_o = randomHnd(1, tokens, dim, StorageType::f16, 34);
  const GradientResult exact = exactAttentionBackward(q, k, v, d_o, false);
  const AttentionVariant forward = dsl::preset("sagebwd", dim)->describe();
  const GradientAccuracy fp16_dp = compareGradients(
      exact, runForwardBackwardReference(forward, dsl::backwardPreset("sagebwd", dim)->describe(), q, k, v, d_o));
  const GradientAccuracy int8_dp = compareGradients(
      exact,
      runForwardBackwardReference(forward, dsl::backwardPreset("sagebwd-int8-dp", dim)->describe(), q, k, v, d_o));
  MESSAGE("dO.V^T f16: dq " << fp16_dp.dq.cosine_similarity << " dk " << fp16_dp.dk.cosine_similarity << " dv "
                            << fp16_dp.dv.cosine_similarity << "; dq rel-L1 " << fp16_dp.dq.relative_l1);
  MESSAGE("dO.V^T int8: dq " << int8_dp.dq.cosine_similarity << " dk " << int8_dp.dk.cosine_similarity << " dv "
                             << int8_dp.dv.cosine_similarity << "; dq rel-L1 " << int8_dp.dq.relative_l1);
  CHECK(fp16_dp.dv.cosine_similarity >= 0.999);
  CHECK(fp16_dp.dq.cosine_similarity >= 0.99);
  CHECK(fp16_dp.dk.cosine_similarity >= 0.99);
  // Table 1(c): quantizing dO.V^T costs dQ accuracy. On iid N(0,1) data the int8 dS dominates dQ's error and the
  // effect is small but clear (measured: 1 - cos +10%, rel-L1 +5%); the next case shows it where V has outliers.
  CHECK(1.0 - int8_dp.dq.cosine_similarity > 1.05 * (1.0 - fp16_dp.dq.cosine_similarity));
  CHECK(int8_dp.dq.relative_l1 > 1.03 * fp16_dp.dq.relative_l1);
  CHECK(int8_dp.dv.cosine_similarity == fp16_dp.dv.cosine_similarity); // dV does not depend on dP

  // V with a per-channel bias (the shared outliers of the paper's section 4.2, here in V): per-block int8 V spends
  // its range on the bias, which dP - D cancels, so the int8 dP loses much of what is left.
  const HostTensor v_biased = randomTensor(1, 1, tokens, dim, StorageType::f16, Layout::hnd, {33, 0.0, 1.0, 4.0});
  const GradientResult exact_biased = exactAttentionBackward(q, k, v_biased, d_o, false);
  const double fp16_biased =
      compareGradients(exact_biased, runForwardBackwardReference(
                                         forward, dsl::backwardPreset("sagebwd", dim)->describe(), q, k, v_biased, d_o))
          .dq.cosine_similarity;
  const double int8_biased =
      compareGradients(exact_biased,
                       runForwardBackwardReference(forward, dsl::backwardPreset("sagebwd-int8-dp", dim)->describe(), q,
                                                   k, v_biased, d_o))
          .dq.cosine_similarity;
  MESSAGE("V bias 4: dq cos f16 dP " << fp16_biased << ", int8 dP " << int8_biased);
  CHECK(fp16_biased >= 0.99);
  CHECK(1.0 - int8_biased > 2.0 * (1.0 - fp16_biased)); // measured 3.4x
}

TEST_CASE("bad shapes and mismatched passes are refused with the argument named") {
  const HostTensor q = randomHnd(2, 8, 64, StorageType::f16, 1);
  const HostTensor kv = randomHnd(1, 8, 64, StorageType::f16, 2);
  const HostTensor wrong = randomHnd(2, 9, 64, StorageType::f16, 3);
  const BackwardVariant backward = dsl::backwardPreset("sagebwd", 64)->describe();
  const std::vector<double> lse(16, 0.0);
  CHECK_THROWS_WITH_AS(runBackwardReference(backward, q, kv, kv, q, wrong, lse), doctest::Contains("d_o: expected"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(runBackwardReference(backward, q, kv, kv, wrong, q, lse), doctest::Contains("o: expected"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(runBackwardReference(backward, q, kv, kv, q, q, std::vector<double>(15, 0.0)),
                       doctest::Contains("lse: expected"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(runBackwardReference(dsl::backwardPreset("sagebwd", 128)->describe(), q, kv, kv, q, q, lse),
                       doctest::Contains("does not match the variant"), std::invalid_argument);
  BackwardVariant per_block_mean = backward;
  per_block_mean.smooth_k = SmoothScope::block;
  CHECK_THROWS_WITH_AS(runBackwardReference(per_block_mean, q, kv, kv, q, q, lse), doctest::Contains("not per block"),
                       std::invalid_argument);
  const AttentionVariant no_lse = dsl::preset("exact", 64)->describe();
  CHECK_THROWS_WITH_AS(runForwardBackwardReference(no_lse, backward, q, kv, kv, q),
                       doctest::Contains("does not write the LSE"), std::invalid_argument);
  const AttentionVariant causal = dsl::preset("sagebwd", 64, MaskKind::causal)->describe();
  CHECK_THROWS_WITH_AS(runForwardBackwardReference(causal, backward, q, kv, kv, q), doctest::Contains("differs"),
                       std::invalid_argument);
}

TEST_CASE("K smoothing: dQ from K - mean(K) equals dQ from K, P from the shifted LSE equals P (double rounding)") {
  // exact-bwd (no quantizer) with and without K smoothing on K = m + e, where each channel's offset m is an integer up
  // to 8 and the token-wise e come in pairs +e, -e of multiples of 2^-6: mean(K) = m and K - mean(K) = e exactly, so
  // the two runs differ only by the algebra: S - q . m in the scores with the LSE shifted by as much, and
  // dQ_i = sum_j dS_ij (K_j - m) / sqrt(d) = sum_j dS_ij K_j / sqrt(d) - r_i m / sqrt(d) with r_i = sum_j dS_ij =
  // sum_j P_ij dP_ij - D_i, zero but for the rounding of the O that D is formed from (stored in f32, as a caller's
  // tensor): r_i = dO_i . (O_i - O_i stored). The test checks that identity to double rounding.
  for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
    CAPTURE(nameOf(mask));
    const int64_t heads_q = 2, heads_kv = 1, tokens = 96, dim = 64;
    const HostTensor q = randomHnd(heads_q, tokens, dim, StorageType::f32, 41);
    const HostTensor v = randomHnd(heads_kv, tokens, dim, StorageType::f32, 43);
    const HostTensor d_o = randomHnd(heads_q, tokens, dim, StorageType::f32, 44);
    const HostTensor noise = randomHnd(heads_kv, tokens / 2, dim, StorageType::f32, 42);
    HostTensor k(1, heads_kv, tokens, dim, StorageType::f32, Layout::hnd);
    std::vector<double> offset(static_cast<size_t>(dim));
    for (int64_t c = 0; c < dim; ++c) {
      offset[c] = static_cast<double>((c * 37) % 17) - 8.0;
      for (int64_t t = 0; t < tokens / 2; ++t) {
        const double e = std::round(std::clamp(static_cast<double>(noise.at(0, 0, t, c)), -1.0, 1.0) * 63.0) / 64.0;
        k.set(0, 0, 2 * t, c, offset[c] + e);
        k.set(0, 0, 2 * t + 1, c, offset[c] - e);
      }
    }
    const AttentionVariant forward = dsl::preset("exact", static_cast<int>(dim), mask)->lse().describe();
    const auto exact_bwd = [&](bool smooth_k) {
      const BackwardVariant variant =
          dsl::backwardPreset("exact-bwd", static_cast<int>(dim), mask)->smooth_k(smooth_k).describe();
      REQUIRE((variant.smooth_k == SmoothScope::sequence) == smooth_k);
      return runForwardBackwardReference(forward, variant, q, k, v, d_o);
    };
    const GradientResult plain = exact_bwd(false), smoothed = exact_bwd(true);
    CHECK(maxAbsDifference(plain.dk, smoothed.dk) <= 1e-12 * maxAbs(plain.dk));
    CHECK(maxAbsDifference(plain.dv, smoothed.dv) <= 1e-12 * maxAbs(plain.dv));
    // r_i from the forward's O in double and as stored
    const AttentionResult output = runReference(forward, q, k, v);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
    std::vector<double> predicted = plain.dq;
    double largest_residual = 0.0, largest_term = 0.0;
    for (int64_t h = 0; h < heads_q; ++h)
      for (int64_t i = 0; i < tokens; ++i) {
        double residual = 0.0;
        for (int64_t c = 0; c < dim; ++c) {
          const double o = output.output[static_cast<size_t>((h * tokens + i) * dim + c)];
          residual += static_cast<double>(d_o.at(0, h, i, c)) * (o - static_cast<double>(static_cast<float>(o)));
        }
        largest_residual = std::max(largest_residual, std::fabs(residual));
        for (int64_t c = 0; c < dim; ++c) {
          const double term = residual * offset[c] * scale;
          predicted[static_cast<size_t>((h * tokens + i) * dim + c)] -= term;
          largest_term = std::max(largest_term, std::fabs(term));
        }
      }
    MESSAGE("largest row sum of dS " << largest_residual << "; its term in dQ " << largest_term << " of "
                                     << maxAbs(plain.dq));
    CHECK(largest_residual <= 1e-6); // the rows of dS sum to zero up to O's f32 rounding
    CHECK(maxAbsDifference(predicted, smoothed.dq) <= 1e-12 * maxAbs(plain.dq));
    CHECK(maxAbs(plain.dq) > 0.0);
  }
}

TEST_CASE("K smoothing on the data that broke SageBwd: K offsets, and Q outlier channels on top (issue 25)") {
  // K with per-channel offsets (std 8, a different one per KV head; GQA 4:2): the bounds against exact
  // gradients, cos >= 0.998 and rel-L1 <= 0.06 for dQ, dK and dV, f16 and bf16, causal or not. N = 256 to stay fast
  // (`sagegen reference-backward --k-bias 8` shows N = 512).
  // Q with 4 outlier channels x 20 (bench/accuracy_bench.py's q_outliers) on top: smoothing takes dQ from cos ~0.25
  // to ~0.99, not to the 0.998: the int8 forward (Algorithm 2, as sage-b) quantizes Q per 128-token block,
  // whose scale the outlier channels set, so its LSE is off by up to ~0.36 and its O has cos ~0.997, and the backward
  // recomputes P from that LSE and D from that O. (With an exact forward the same backward gives dQ cos 0.9896: the
  // remaining backward error is the S product's Q, also per block.)
  struct DataClass {
    const char *name;
    int64_t heads_q, heads_kv, outlier_channels;
  };
  const int64_t tokens = 256, dim = 128;
  for (const DataClass &data : {DataClass{"K offsets", 4, 2, 0}, DataClass{"K offsets + Q outliers", 2, 1, 4}})
    for (StorageType storage : {StorageType::f16, StorageType::bf16})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
        const std::string type = storage == StorageType::bf16 ? "bf16" : "f16";
        const std::string name = data.name;
        CAPTURE(name);
        CAPTURE(type);
        CAPTURE(nameOf(mask));
        const HostTensor q = randomTensor(1, data.heads_q, tokens, dim, storage, Layout::hnd,
                                          {51, 0.0, 1.0, 0.0, data.outlier_channels, 20.0});
        const HostTensor k = keysWithOffsets(data.heads_kv, tokens, dim, storage, 52, 8.0);
        const HostTensor v = randomHnd(data.heads_kv, tokens, dim, storage, 53);
        const HostTensor d_o = randomHnd(data.heads_q, tokens, dim, storage, 54);
        const GradientResult exact = exactAttentionBackward(q, k, v, d_o, mask == MaskKind::causal);
        const GradientAccuracy smoothed = sagebwdAccuracy(exact, q, k, v, d_o, mask, true);
        const GradientAccuracy ablation = sagebwdAccuracy(exact, q, k, v, d_o, mask, false);
        MESSAGE(std::string(data.name) << ": smoothed dq " << smoothed.dq.cosine_similarity << " / "
                                       << smoothed.dq.relative_l1 << ", dk " << smoothed.dk.cosine_similarity << " / "
                                       << smoothed.dk.relative_l1 << ", dv " << smoothed.dv.cosine_similarity << " / "
                                       << smoothed.dv.relative_l1 << "; without smoothing dq "
                                       << ablation.dq.cosine_similarity << ", dk " << ablation.dk.cosine_similarity
                                       << ", dv " << ablation.dv.cosine_similarity);
        for (const AccuracyMetrics *metrics : {&smoothed.dq, &smoothed.dk, &smoothed.dv}) {
          if (data.outlier_channels == 0) {
            CHECK(metrics->cosine_similarity >= 0.998);
            CHECK(metrics->relative_l1 <= 0.06);
          } else {
            CHECK(metrics->cosine_similarity >= 0.985);
          }
        }
        // Without smoothing the offsets take the int8 range of K (S and dQ = dS.K): dQ falls apart.
        CHECK(ablation.dq.cosine_similarity < 0.95);
        CHECK(1.0 - ablation.dq.cosine_similarity > 20.0 * (1.0 - smoothed.dq.cosine_similarity));
        CHECK(1.0 - ablation.dk.cosine_similarity > 2.0 * (1.0 - smoothed.dk.cosine_similarity));
        CHECK(1.0 - ablation.dv.cosine_similarity > 2.0 * (1.0 - smoothed.dv.cosine_similarity));
      }
}
