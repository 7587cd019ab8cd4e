// The CPU reference's randomized Hadamard rotation (issue 28): where it applies (after smoothing, on what Q's and K's
// quantizers quantize, nothing else), and what it buys on data with outlier channels.
#include "sage/dsl/Presets.h"
#include "sage/numerics/Hadamard.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <span>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::reference;

namespace {

// `tensor` with every token rotated as Q's (or K's) quantizer rotates it, stored in f32 (exactly what was computed).
HostTensor rotatedTensor(const HostTensor &tensor, uint32_t seed, bool for_k) {
  HostTensor result(tensor.batch(), tensor.heads(), tensor.tokens(), tensor.dim(), StorageType::f32, Layout::hnd);
  std::vector<float> row(static_cast<size_t>(tensor.dim()));
  for (int64_t b = 0; b < tensor.batch(); ++b)
    for (int64_t h = 0; h < tensor.heads(); ++h)
      for (int64_t t = 0; t < tensor.tokens(); ++t) {
        for (int64_t c = 0; c < tensor.dim(); ++c)
          row[c] = tensor.at(b, h, t, c);
        numerics::hadamardRotate(row, seed, for_k);
        for (int64_t c = 0; c < tensor.dim(); ++c)
          result.set(b, h, t, c, row[c]);
      }
  return result;
}

AttentionVariant withRotation(AttentionVariant variant, uint32_t seed) {
  variant.name += "-rot";
  variant.q.rotation_seed = seed;
  variant.k.rotation_seed = seed;
  return dsl::emitProgram(variant).variant(); // verified
}

HostTensor outlierTensor(uint64_t seed, int64_t tokens, double bias, double outliers) {
  return randomTensor(1, 2, tokens, 128, StorageType::f16, Layout::hnd,
                      {seed, 0.0, 1.0, bias, outliers != 1.0 ? 4 : 0, outliers});
}

} // namespace

TEST_CASE("a rotated variant quantizes exactly the rotated tokens: the same as rotating the inputs") {
  // No smoothing and no folded scale, so that rotating inside the quantizer and rotating the caller's f32 tensors are
  // the same f32 operations.
  for (Granularity granularity : {Granularity::per_block, Granularity::per_token, Granularity::per_tensor}) {
    CAPTURE(nameOf(granularity));
    AttentionVariant plain =
        dsl::attention("plain").head_dim(64).qk(dsl::int8(granularity)).pv(dsl::f16(dsl::accum::f32)).lse().describe();
    plain.q.fold_softmax_scale = false;
    plain = dsl::emitProgram(plain).variant();
    const AttentionVariant rotated = withRotation(plain, 11);
    const HostTensor q = randomTensor(1, 2, 200, 64, StorageType::f32, Layout::hnd, {1, 0.0, 1.0, 0.0, 4, 20.0});
    const HostTensor k = randomTensor(1, 2, 150, 64, StorageType::f32, Layout::hnd, {2});
    const HostTensor v = randomTensor(1, 2, 150, 64, StorageType::f32, Layout::hnd, {3});
    const AttentionResult inside = runReference(rotated, q, k, v);
    const AttentionResult outside = runReference(plain, rotatedTensor(q, 11, false), rotatedTensor(k, 11, true), v);
    CHECK(inside.output == outside.output);
    CHECK(inside.lse == outside.lse);
    CHECK(inside.output != runReference(plain, q, k, v).output); // the rotation did change the codes
  }
}

TEST_CASE("rotation spares int8 Q.K^T the Q outlier channels that smoothing cannot remove") {
  const HostTensor q = outlierTensor(1, 512, 0.0, 20.0);
  const HostTensor k = outlierTensor(2, 512, 8.0, 1.0);
  const HostTensor v = outlierTensor(3, 512, 0.0, 1.0);
  const AttentionResult exact = exactAttention(q, k, v, false);
  for (const std::string name : {"sage-b", "sage2-fp8"}) {
    CAPTURE(name);
    const AttentionVariant variant = dsl::preset(name, 128, MaskKind::none)->describe();
    const double plain = compareOutputs(exact.output, runReference(variant, q, k, v).output).relative_l1;
    const AccuracyMetrics rotated =
        compareOutputs(exact.output, runReference(withRotation(variant, 0), q, k, v).output);
    CAPTURE(plain);
    CAPTURE(rotated.relative_l1);
    CHECK(rotated.relative_l1 < 0.6 * plain); // 2-3.4x less (bench/results/rotation_reference_2026-11-29.md)
    CHECK(rotated.cosine_similarity > 0.999);
  }
}

TEST_CASE("rotation keeps Q smoothing's correction on the unrotated K (sage2-int4)") {
  // S = psi^-1(Q^ K^^T) + mean(Q_i) K^T: the quantized product is of rotated tokens, the GEMV of unrotated ones. A
  // GEMV of rotated K would add mean(Q_i) K R_K^T, not mean(Q_i) K^T, and wreck S wherever Q has a block mean.
  const HostTensor q = randomTensor(1, 2, 256, 128, StorageType::f16, Layout::hnd, {4, 0.0, 1.0, 4.0});
  const HostTensor k = randomTensor(1, 2, 256, 128, StorageType::f16, Layout::hnd, {5, 0.0, 1.0, 4.0});
  const HostTensor v = randomTensor(1, 2, 256, 128, StorageType::f16, Layout::hnd, {6});
  const AttentionResult exact = exactAttention(q, k, v, false);
  const AttentionVariant variant = dsl::preset("sage2-int4", 128, MaskKind::none)->describe();
  const double plain = compareOutputs(exact.output, runReference(variant, q, k, v).output).cosine_similarity;
  const double rotated =
      compareOutputs(exact.output, runReference(withRotation(variant, 0), q, k, v).output).cosine_similarity;
  CAPTURE(plain);
  CAPTURE(rotated);
  CHECK(rotated > 0.99);
  CHECK(rotated > plain - 0.002);
}
