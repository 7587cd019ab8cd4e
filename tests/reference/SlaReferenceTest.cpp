// The SLA reference (issue 13): block classes on hand-made inputs, the forward against a dense masked formula, the
// backward against central finite differences on tiny sizes.
#include "ReferenceTestSupport.h"
#include "sage/dsl/Presets.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Sla.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

using namespace sage;
using namespace sage::reference;
using sage::reference_test::maxAbsDifference;

namespace {

constexpr int64_t kBlock = 16;

// An exact (f32, unquantized) SLA variant with 16-token blocks, for the dense and finite-difference comparisons.
AttentionVariant exactSla(int head_dim, FeatureMap map, double critical = 5.0, double negligible = 10.0) {
  return dsl::attention("sla-exact")
      .head_dim(head_dim)
      .blocks(kBlock, kBlock)
      .qk(dsl::full_precision())
      .pv(dsl::full_precision_pv())
      .sla(dsl::sla_spec(map, critical, negligible))
      .describe();
}

Projection randomProjection(int64_t d, uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, 1.0 / std::sqrt(static_cast<double>(d)));
  Projection projection{d, std::vector<double>(static_cast<size_t>(d * d)),
                        std::vector<double>(static_cast<size_t>(d))};
  for (double &w : projection.weight)
    w = normal(generator);
  for (double &b : projection.bias)
    b = normal(generator);
  return projection;
}

// Random data kept at least `gap` away from 0, so relu's and elu's kinks lie outside a finite-difference step.
HostTensor awayFromZero(int64_t batch, int64_t heads, int64_t tokens, int64_t dim, uint64_t seed, double gap = 0.05) {
  HostTensor tensor = randomTensor(batch, heads, tokens, dim, StorageType::f32, Layout::hnd, {seed});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < dim; ++c) {
          const double x = tensor.at(b, h, t, c);
          tensor.set(b, h, t, c, x >= 0.0 ? x + gap : x - gap);
        }
  return tensor;
}

// The dense formula, element by element: softmax over the critical keys, plus Proj of the phi-weighted average of V
// over the marginal keys.
std::vector<double> denseSla(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k,
                             const HostTensor &v, const Projection &projection, const BlockClasses &classes,
                             std::vector<double> *linear_out = nullptr) {
  const int64_t d = q.dim(), group = q.heads() / k.heads();
  std::vector<double> output(static_cast<size_t>(q.batch() * q.heads() * q.tokens() * d), 0.0);
  if (linear_out)
    linear_out->assign(output.size(), 0.0);
  std::vector<double> x(static_cast<size_t>(d)), phi_q(static_cast<size_t>(d)), phi_k(static_cast<size_t>(d));
  for (int64_t b = 0; b < q.batch(); ++b)
    for (int64_t h = 0; h < q.heads(); ++h)
      for (int64_t r = 0; r < q.tokens(); ++r) {
        const int64_t i = r / variant.block_q;
        for (int64_t c = 0; c < d; ++c)
          x[c] = q.at(b, h, r, c);
        applyFeatureMap(variant.sla.feature_map, x.data(), phi_q.data(), d);
        std::vector<double> sparse(static_cast<size_t>(d), 0.0), linear(static_cast<size_t>(d), 0.0);
        double max_logit = -INFINITY, exp_sum = 0.0, weight_sum = 0.0;
        std::vector<double> logits(static_cast<size_t>(k.tokens()), -INFINITY);
        for (int64_t t = 0; t < k.tokens(); ++t)
          if (classes.at(b, h, i, t / variant.block_kv) == BlockClass::critical) {
            double s = 0.0;
            for (int64_t c = 0; c < d; ++c)
              s += static_cast<double>(q.at(b, h, r, c)) * k.at(b, h / group, t, c);
            logits[t] = s / std::sqrt(static_cast<double>(d));
            max_logit = std::max(max_logit, logits[t]);
          }
        for (int64_t t = 0; t < k.tokens(); ++t) {
          const BlockClass cls = classes.at(b, h, i, t / variant.block_kv);
          if (cls == BlockClass::critical) {
            const double p = std::exp(logits[t] - max_logit);
            exp_sum += p;
            for (int64_t c = 0; c < d; ++c)
              sparse[c] += p * v.at(b, h / group, t, c);
          } else if (cls == BlockClass::marginal) {
            for (int64_t c = 0; c < d; ++c)
              x[c] = k.at(b, h / group, t, c);
            applyFeatureMap(variant.sla.feature_map, x.data(), phi_k.data(), d);
            double w = 0.0;
            for (int64_t c = 0; c < d; ++c)
              w += phi_q[c] * phi_k[c];
            weight_sum += w;
            for (int64_t c = 0; c < d; ++c)
              linear[c] += w * v.at(b, h / group, t, c);
          }
        }
        const size_t row = static_cast<size_t>(((b * q.heads() + h) * q.tokens() + r) * d);
        for (int64_t c = 0; c < d; ++c)
          linear[c] = weight_sum == 0.0 ? 0.0 : linear[c] / weight_sum;
        for (int64_t out = 0; out < d; ++out) {
          double value = exp_sum > 0.0 ? sparse[out] / exp_sum : 0.0;
          value += projection.bias.empty() ? 0.0 : projection.bias[out];
          for (int64_t in = 0; in < d; ++in)
            value += projection.weight[out * d + in] * linear[in];
          output[row + out] = value;
          if (linear_out)
            (*linear_out)[row + out] = linear[out];
        }
      }
  return output;
}

// Q [1, 1, 2 blocks, 16] and K [1, 1, 20 blocks, 16] whose pooled scores are s_i * a_j along channel 0: q block 0
// has s = +1 and q block 1 s = -1, so the two rows rank the kv blocks in opposite orders.
struct HandMade {
  HostTensor q{1, 1, 2 * kBlock, 16, StorageType::f32, Layout::hnd};
  HostTensor k{1, 1, 20 * kBlock, 16, StorageType::f32, Layout::hnd};
  std::vector<double> a;
};

HandMade handMade() {
  HandMade inputs;
  // Ties on purpose: blocks 0, 1, 2 share the lowest value, blocks 3 and 17 the highest.
  for (int j = 0; j < 20; ++j)
    inputs.a.push_back(j < 3 ? 0.0 : (j == 3 || j == 17) ? 4.0 : 0.125 * j);
  for (int64_t t = 0; t < 2 * kBlock; ++t)
    inputs.q.set(0, 0, t, 0, t < kBlock ? 1.0 : -1.0);
  for (int64_t t = 0; t < 20 * kBlock; ++t) {
    inputs.k.set(0, 0, t, 0, inputs.a[t / kBlock]);
    inputs.k.set(0, 0, t, 1, t % 2 == 0 ? 0.5 : -0.5); // averages out in the pool; q has no channel 1
  }
  return inputs;
}

} // namespace

TEST_CASE("blocks per row of each class: ceil of k_h, floor of k_l, at least one critical") {
  SlaSpec spec; // 5% / 10%
  CHECK(criticalBlocksPerRow(spec, 20) == 1);
  CHECK(criticalBlocksPerRow(spec, 21) == 2);
  CHECK(criticalBlocksPerRow(spec, 1) == 1);
  CHECK(criticalBlocksPerRow(spec, 512) == 26);
  CHECK(negligibleBlocksPerRow(spec, 20) == 2);
  CHECK(negligibleBlocksPerRow(spec, 9) == 0);
  CHECK(negligibleBlocksPerRow(spec, 512) == 51);
  spec.critical_percent = 50.0;
  spec.negligible_percent = 50.0;
  CHECK(criticalBlocksPerRow(spec, 3) == 2);
  CHECK(negligibleBlocksPerRow(spec, 3) == 1);
  spec.critical_percent = 100.0;
  spec.negligible_percent = 0.0;
  CHECK(criticalBlocksPerRow(spec, 7) == 7);
  CHECK(negligibleBlocksPerRow(spec, 7) == 0);
}

TEST_CASE("mask prediction on hand-made inputs: top and bottom per row, ties to the lower kv block") {
  const HandMade inputs = handMade();
  const MaskPrediction prediction = predictBlockClasses(exactSla(16, FeatureMap::softmax), inputs.q, inputs.k);
  REQUIRE(prediction.classes.q_blocks == 2);
  REQUIRE(prediction.classes.kv_blocks == 20);
  // Row 0 (s = +1): a_3 = a_17 = 4 tie for the top: block 3 (the lower) is critical, 17 marginal. Bottom 2 of the
  // tied a_0 = a_1 = a_2 = 0: they rank 0, 1, 2, so blocks 1 and 2 take the last two ranks.
  for (int64_t j = 0; j < 20; ++j) {
    CAPTURE(j);
    const BlockClass expected = j == 3               ? BlockClass::critical
                                : (j == 1 || j == 2) ? BlockClass::negligible
                                                     : BlockClass::marginal;
    CHECK(prediction.classes.at(0, 0, 0, j) == expected);
  }
  // Row 1 (s = -1): blocks 0, 1, 2 tie for the top: block 0 is critical; the bottom two are 3 and 17.
  for (int64_t j = 0; j < 20; ++j) {
    CAPTURE(j);
    const BlockClass expected = j == 0                ? BlockClass::critical
                                : (j == 3 || j == 17) ? BlockClass::negligible
                                                      : BlockClass::marginal;
    CHECK(prediction.classes.at(0, 0, 1, j) == expected);
  }
  // P_c = softmax(s_i a_j / sqrt(16)) per row.
  for (int64_t i = 0; i < 2; ++i) {
    const double s = i == 0 ? 1.0 : -1.0;
    double sum = 0.0;
    for (double a : inputs.a)
      sum += std::exp(s * a / 4.0);
    for (int64_t j = 0; j < 20; ++j)
      CHECK(prediction.compressed[static_cast<size_t>(i * 20 + j)] ==
            doctest::Approx(std::exp(s * inputs.a[j] / 4.0) / sum).epsilon(1e-12));
  }
}

TEST_CASE("mask prediction pools a short last block over its own tokens, and per GQA head") {
  // K: one full block at 0 and a last block of 4 tokens 1, 2, 3, 4 (mean 2.5) along channel 0; two q heads share it,
  // the second with the opposite sign.
  HostTensor q(1, 2, kBlock, 16, StorageType::f32, Layout::hnd);
  HostTensor k(1, 1, kBlock + 4, 16, StorageType::f32, Layout::hnd);
  for (int64_t t = 0; t < kBlock; ++t) {
    q.set(0, 0, t, 0, 1.0);
    q.set(0, 1, t, 0, -1.0);
  }
  for (int64_t t = 0; t < 4; ++t)
    k.set(0, 0, kBlock + t, 0, 1.0 + t);
  const MaskPrediction prediction = predictBlockClasses(exactSla(16, FeatureMap::softmax, 50.0, 0.0), q, k);
  const double expected = std::exp(2.5 / 4.0) / (1.0 + std::exp(2.5 / 4.0));
  CHECK(prediction.compressed[1] == doctest::Approx(expected).epsilon(1e-12));
  CHECK(prediction.classes.at(0, 0, 0, 1) == BlockClass::critical);
  CHECK(prediction.classes.at(0, 0, 0, 0) == BlockClass::marginal);
  CHECK(prediction.classes.at(0, 1, 0, 0) == BlockClass::critical);
  CHECK(prediction.classes.at(0, 1, 0, 1) == BlockClass::marginal);
}

TEST_CASE("mask prediction refuses non-SLA variants and non-finite scores") {
  const HandMade inputs = handMade();
  CHECK_THROWS_WITH_AS(predictBlockClasses(dsl::preset("exact")->describe(), inputs.q, inputs.k),
                       doctest::Contains("not an SLA variant"), std::invalid_argument);
  HostTensor k = inputs.k;
  k.set(0, 0, 5, 0, INFINITY);
  CHECK_THROWS_WITH_AS(predictBlockClasses(exactSla(16, FeatureMap::softmax), inputs.q, k),
                       doctest::Contains("is not finite"), std::invalid_argument);
  AttentionVariant bad_percent = exactSla(16, FeatureMap::softmax);
  bad_percent.sla.critical_percent = std::nan("");
  CHECK_THROWS_WITH_AS(predictBlockClasses(bad_percent, inputs.q, inputs.k), doctest::Contains("variant.sla: expected"),
                       std::invalid_argument);
  CHECK(criticalBlocksPerRow(bad_percent.sla, 10) == 1); // NaN counts as 0%: still one critical block
  CHECK_THROWS_WITH_AS(runReference(exactSla(16, FeatureMap::softmax), inputs.q, inputs.k, inputs.k),
                       doctest::Contains("run it with runSlaReference"), std::invalid_argument);
}

TEST_CASE("the SLA forward equals the dense masked formula, for each feature map") {
  const int64_t d = 32;
  const HostTensor q = randomTensor(2, 4, 72, d, StorageType::f16, Layout::nhd, {11});
  const HostTensor k = randomTensor(2, 2, 100, d, StorageType::f16, Layout::nhd, {12, 0.0, 1.0, 1.0});
  const HostTensor v = randomTensor(2, 2, 100, d, StorageType::f16, Layout::nhd, {13});
  const Projection projection = randomProjection(d, 14);
  for (FeatureMap map : {FeatureMap::softmax, FeatureMap::elu_plus_one, FeatureMap::relu}) {
    CAPTURE(nameOf(map));
    const AttentionVariant variant = exactSla(static_cast<int>(d), map, 20.0, 30.0); // 7 kv blocks: 2 / 3 / 2
    const SlaResult result = runSlaReference(variant, q, k, v, projection);
    REQUIRE(result.classes.kv_blocks == 7);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t i = 0; i < result.classes.q_blocks; ++i) {
          int counts[3] = {0, 0, 0};
          for (int64_t j = 0; j < 7; ++j)
            ++counts[static_cast<int>(result.classes.at(b, h, i, j)) + 1];
          CHECK(counts[0] == 2); // negligible: floor(30% of 7)
          CHECK(counts[1] == 3);
          CHECK(counts[2] == 2); // critical: ceil(20% of 7)
        }
    std::vector<double> dense_linear;
    const std::vector<double> dense = denseSla(variant, q, k, v, projection, result.classes, &dense_linear);
    CHECK(maxAbsDifference(result.output, dense) < 1e-12);
    CHECK(maxAbsDifference(result.linear, dense_linear) < 1e-12);
  }
}

TEST_CASE("the quantized SLA presets: linear branch exact, sparse part close to the exact formula") {
  const int64_t d = 64;
  const HostTensor q = randomTensor(1, 2, 512, d, StorageType::f16, Layout::hnd, {21});
  const HostTensor k = randomTensor(1, 2, 512, d, StorageType::f16, Layout::hnd, {22, 0.0, 1.0, 2.0});
  const HostTensor v = randomTensor(1, 2, 512, d, StorageType::f16, Layout::hnd, {23});
  const Projection projection = randomProjection(d, 24);
  for (const char *name : {"sla-f16", "sla-int8"}) {
    CAPTURE(name);
    const AttentionVariant variant = dsl::preset(name, static_cast<int>(d))->describe();
    const SlaResult result = runSlaReference(variant, q, k, v, projection);
    std::vector<double> dense_linear;
    const std::vector<double> dense = denseSla(variant, q, k, v, projection, result.classes, &dense_linear);
    CHECK(maxAbsDifference(result.linear, dense_linear) < 1e-12);
    const AccuracyMetrics metrics = compareOutputs(dense, result.output);
    CHECK(metrics.cosine_similarity > 0.999);
    CHECK(metrics.relative_l1 < 0.05);
  }
}

TEST_CASE("given classes are used as they are, and checked") {
  const HandMade inputs = handMade();
  const AttentionVariant variant = exactSla(16, FeatureMap::softmax);
  BlockClasses all_critical{1, 1, 2, 20, std::vector<BlockClass>(40, BlockClass::critical)};
  const SlaResult result =
      runSlaReference(variant, inputs.q, inputs.k, inputs.k, randomProjection(16, 1), &all_critical);
  for (double value : result.linear)
    CHECK(value == 0.0); // no marginal block: O^l = 0
  BlockClasses wrong{1, 1, 2, 19, std::vector<BlockClass>(38, BlockClass::critical)};
  CHECK_THROWS_WITH_AS(runSlaReference(variant, inputs.q, inputs.k, inputs.k, randomProjection(16, 1), &wrong),
                       doctest::Contains("classes: expected [batch, heads_q, 2, 20]"), std::invalid_argument);
  Projection bad = randomProjection(16, 1);
  bad.bias.resize(3);
  CHECK_THROWS_WITH_AS(runSlaReference(variant, inputs.q, inputs.k, inputs.k, bad),
                       doctest::Contains("projection: the bias has 3 values"), std::invalid_argument);
}

TEST_CASE("feature maps' vector-Jacobian products match finite differences") {
  const std::vector<double> x = {0.3, -1.2, 0.7, 2.1, -0.4, 0.05, -2.5, 1.1};
  const std::vector<double> dy = {0.5, -0.25, 1.0, 0.75, -1.5, 0.1, 0.3, -0.6};
  const int64_t n = static_cast<int64_t>(x.size());
  for (FeatureMap map : {FeatureMap::softmax, FeatureMap::elu_plus_one, FeatureMap::relu}) {
    CAPTURE(nameOf(map));
    std::vector<double> dx(x.size()), y(x.size());
    featureMapBackward(map, x.data(), dy.data(), dx.data(), n);
    for (int64_t c = 0; c < n; ++c) {
      const double h = 1e-6;
      std::vector<double> plus = x, minus = x;
      plus[c] += h;
      minus[c] -= h;
      double f_plus = 0.0, f_minus = 0.0;
      applyFeatureMap(map, plus.data(), y.data(), n);
      for (int64_t e = 0; e < n; ++e)
        f_plus += dy[e] * y[e];
      applyFeatureMap(map, minus.data(), y.data(), n);
      for (int64_t e = 0; e < n; ++e)
        f_minus += dy[e] * y[e];
      CHECK(dx[c] == doctest::Approx((f_plus - f_minus) / (2 * h)).epsilon(1e-6));
    }
  }
}

TEST_CASE("the SLA backward matches central finite differences (dQ, dK, dV, dW, db; GQA; every class)") {
  const int64_t d = 16, n_q = 2 * kBlock, n_kv = 3 * kBlock;
  HostTensor q = awayFromZero(1, 2, n_q, d, 31);
  HostTensor k = awayFromZero(1, 1, n_kv, d, 32);
  HostTensor v = awayFromZero(1, 1, n_kv, d, 33);
  Projection projection = randomProjection(d, 34);
  // Hand-made M_c with each class in each row; the two q heads differ.
  const BlockClass C = BlockClass::critical, M = BlockClass::marginal, N = BlockClass::negligible;
  const BlockClasses classes{1, 2, 2, 3, {C, M, N, N, C, M, /* head 1 */ M, C, M, C, N, M}};
  std::vector<double> d_output(static_cast<size_t>(2 * n_q * d));
  std::mt19937_64 generator(35);
  std::normal_distribution<double> normal;
  for (double &g : d_output)
    g = normal(generator);

  for (FeatureMap map : {FeatureMap::softmax, FeatureMap::elu_plus_one, FeatureMap::relu}) {
    CAPTURE(nameOf(map));
    const AttentionVariant variant = exactSla(static_cast<int>(d), map);
    auto loss = [&]() {
      const SlaResult result = runSlaReference(variant, q, k, v, projection, &classes);
      double sum = 0.0;
      for (size_t e = 0; e < d_output.size(); ++e)
        sum += d_output[e] * result.output[e];
      return sum;
    };
    const SlaGradients grads = runSlaBackward(variant, q, k, v, projection, classes, d_output);
    auto check = [](double analytic, double numeric) {
      CHECK(std::fabs(analytic - numeric) <= 1e-6 + 1e-5 * std::fabs(analytic));
    };

    // Inputs are stored in f32: step by what the storage holds and divide by the step actually taken.
    for (HostTensor *tensor : {&q, &k, &v}) {
      const std::vector<double> &analytic = tensor == &q ? grads.dq : tensor == &k ? grads.dk : grads.dv;
      const char *name = tensor == &q ? "dq" : tensor == &k ? "dk" : "dv";
      CAPTURE(name);
      for (int64_t h = 0; h < tensor->heads(); ++h)
        for (int64_t t = 0; t < tensor->tokens(); ++t)
          for (int64_t c = 0; c < d; ++c) {
            const double original = tensor->at(0, h, t, c);
            tensor->set(0, h, t, c, original + 1e-3);
            const double up = tensor->at(0, h, t, c);
            const double f_up = loss();
            tensor->set(0, h, t, c, original - 1e-3);
            const double down = tensor->at(0, h, t, c);
            const double f_down = loss();
            tensor->set(0, h, t, c, original);
            check(analytic[static_cast<size_t>((h * tensor->tokens() + t) * d + c)], (f_up - f_down) / (up - down));
          }
    }
    for (std::vector<double> *parameters : {&projection.weight, &projection.bias}) {
      const std::vector<double> &analytic = parameters == &projection.weight ? grads.dweight : grads.dbias;
      for (size_t e = 0; e < parameters->size(); ++e) {
        const double original = (*parameters)[e];
        (*parameters)[e] = original + 1e-4;
        const double f_up = loss();
        (*parameters)[e] = original - 1e-4;
        const double f_down = loss();
        (*parameters)[e] = original;
        check(analytic[e], (f_up - f_down) / 2e-4);
      }
    }
    // The sparse part's LSE is that of the critical keys only.
    CHECK(grads.sparse_lse[0] ==
          doctest::Approx(runSlaReference(variant, q, k, v, projection, &classes).sparse.lse[0]).epsilon(1e-12));
  }
}
