// The rotating backward on the CPU reference (issue 25): with no quantizer the rotation changes the gradients only by
// the f32 rounding of the rotated operands (S = (Q R_Q)(K R_K)^T, dQ and dK rotated back), and on K offsets plus Q
// outlier channels sagebwd-rot, after the rotated forward, beats sagebwd and meets the cosine bound, and with
// per-token scales for P and dS (token_scales) its rel-L1 bound too.
#include "ReferenceTestSupport.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/reference/Backward.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::reference;
using namespace sage::reference_test;

namespace {

// The forward preset `sagebwd` (Algorithm 2), rotated as `backward` is.
AttentionVariant pairedForward(int dim, MaskKind mask, const BackwardVariant &backward) {
  AttentionVariant forward = dsl::preset("sagebwd", dim, mask)->describe();
  forward.q.rotation_seed = forward.k.rotation_seed = backward.product(BackwardProduct::s).lhs.rotation_seed;
  return dsl::emitProgram(forward).variant(); // verified
}

// The gradients of a backward preset (after its paired forward), with or without token_scales(), against exact ones.
using AccuracyOf = std::function<GradientAccuracy(const char *preset, bool token_scales)>;

// The data of the failing row (K offsets std 8, 4 Q channels x 20; GQA 2:1), N = 256 to stay fast, f16 and
// bf16, causal or not: `check` gets each case's AccuracyOf.
void forOutlierData(const std::function<void(const AccuracyOf &)> &check) {
  const int64_t tokens = 256;
  const int dim = 128;
  for (StorageType storage : {StorageType::f16, StorageType::bf16})
    for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
      const std::string type = storage == StorageType::bf16 ? "bf16" : "f16";
      CAPTURE(type);
      CAPTURE(nameOf(mask));
      const HostTensor q = randomTensor(1, 2, tokens, dim, storage, Layout::hnd, {51, 0.0, 1.0, 0.0, 4, 20.0});
      const HostTensor k = keysWithOffsets(1, tokens, dim, storage, 52, 8.0);
      const HostTensor v = randomTensor(1, 1, tokens, dim, storage, Layout::hnd, {53});
      const HostTensor d_o = randomTensor(1, 2, tokens, dim, storage, Layout::hnd, {54});
      const GradientResult exact = exactAttentionBackward(q, k, v, d_o, mask == MaskKind::causal);
      const ElementType float_type = storage == StorageType::bf16 ? ElementType::bf16 : ElementType::f16;
      check([&](const char *preset, bool token_scales) {
        dsl::AttentionBackwardBuilder builder = *dsl::backwardPreset(preset, dim, mask);
        builder.float_type(float_type);
        if (token_scales)
          builder.token_scales(true, true);
        const BackwardVariant backward = builder.build().variant();
        return compareGradients(
            exact, runForwardBackwardReference(pairedForward(dim, mask, backward), backward, q, k, v, d_o));
      });
    }
}

} // namespace

TEST_CASE("without quantizers the rotation changes the gradients by f32 rounding only") {
  // exact-bwd's f32 casts with the rotation's seed set directly on Q's and K's specs (the IR refuses a rotated cast:
  // it protects no scale): the rotated operands are rounded to f32 once, everything else is the same double algebra.
  for (MaskKind mask : {MaskKind::none, MaskKind::causal})
    for (bool smooth_k : {false, true}) {
      CAPTURE(nameOf(mask));
      CAPTURE(smooth_k);
      const int64_t heads_q = 2, heads_kv = 1, tokens = 80, dim = 64;
      const HostTensor q =
          randomTensor(1, heads_q, tokens, dim, StorageType::f32, Layout::hnd, {61, 0.0, 1.0, 0.0, 4, 20.0});
      const HostTensor k = keysWithOffsets(heads_kv, tokens, dim, StorageType::f32, 62, 4.0);
      const HostTensor v = randomTensor(1, heads_kv, tokens, dim, StorageType::f32, Layout::hnd, {63});
      const HostTensor d_o = randomTensor(1, heads_q, tokens, dim, StorageType::f32, Layout::hnd, {64});
      const AttentionVariant forward = dsl::preset("exact", static_cast<int>(dim), mask)->lse().describe();
      const BackwardVariant plain =
          dsl::backwardPreset("exact-bwd", static_cast<int>(dim), mask)->smooth_k(smooth_k).describe();
      BackwardVariant rotated = plain;
      using P = BackwardProduct;
      for (QuantizerSpec *spec : {&rotated.product(P::s).lhs, &rotated.product(P::s).rhs, &rotated.product(P::dq).rhs,
                                  &rotated.product(P::dk).rhs})
        spec->rotation_seed = 99u;
      const GradientResult a = runForwardBackwardReference(forward, plain, q, k, v, d_o);
      const GradientResult b = runForwardBackwardReference(forward, rotated, q, k, v, d_o);
      MESSAGE("max |difference| / max |gradient|: dq " << maxAbsDifference(a.dq, b.dq) / maxAbs(a.dq) << ", dk "
                                                       << maxAbsDifference(a.dk, b.dk) / maxAbs(a.dk) << ", dv "
                                                       << maxAbsDifference(a.dv, b.dv) / maxAbs(a.dv));
      // f32 rounding of the rotated operands: a few 1e-6 of the largest gradient, far from a wrong sign or a missing
      // 2^-e (which would be O(1)). Without smoothing dQ = dS K cancels K's offsets (dS's rows sum to zero), so the
      // offsets' rounding weighs ~10x more there (measured 1.7e-5).
      const double bound = smooth_k ? 1e-5 : 1e-4;
      CHECK(maxAbsDifference(a.dq, b.dq) <= bound * maxAbs(a.dq));
      CHECK(maxAbsDifference(a.dk, b.dk) <= 1e-5 * maxAbs(a.dk));
      CHECK(maxAbsDifference(a.dv, b.dv) <= 1e-5 * maxAbs(a.dv));
      CHECK(maxAbs(a.dq) > 0.0);
    }
}

TEST_CASE("sagebwd-rot on K offsets + Q outlier channels: better than sagebwd, within the issue's cosine bound") {
  // The reference's word on rel-L1: dQ meets 0.06; dK and dV stay near 0.07-0.09 (the per-tile int8 scales of dS in
  // dK and of P in dV: `sagegen reference-backward --preset sagebwd-rot --k-bias 8 --q-outliers 20 --exact dk.ds,dv.p`
  // shows it; the per-token scales of the next case fix it). So: cos >= 0.998 for all three, rel-L1 <= 0.06 for dQ
  // and <= 0.10 for dK and dV, and each error below sagebwd's.
  forOutlierData([](const AccuracyOf &accuracy) {
    const GradientAccuracy rotated = accuracy("sagebwd-rot", false), plain = accuracy("sagebwd", false);
    MESSAGE("sagebwd-rot dq " << rotated.dq.cosine_similarity << " / " << rotated.dq.relative_l1 << ", dk "
                              << rotated.dk.cosine_similarity << " / " << rotated.dk.relative_l1 << ", dv "
                              << rotated.dv.cosine_similarity << " / " << rotated.dv.relative_l1 << "; sagebwd dq "
                              << plain.dq.cosine_similarity << ", dk " << plain.dk.cosine_similarity << ", dv "
                              << plain.dv.cosine_similarity);
    for (const auto &[with, without] :
         {std::pair{&rotated.dq, &plain.dq}, std::pair{&rotated.dk, &plain.dk}, std::pair{&rotated.dv, &plain.dv}}) {
      CHECK(with->cosine_similarity >= 0.998);
      CHECK(with->relative_l1 <= 0.10);
      CHECK(with->relative_l1 < without->relative_l1);
      CHECK(1.0 - with->cosine_similarity < 1.0 - without->cosine_similarity);
    }
    CHECK(rotated.dq.relative_l1 <= 0.06);
  });
}

TEST_CASE("sagebwd-rot with per-token P and dS scales on K offsets + Q outlier channels: the issue's target") {
  // One int8 scale per key (P in dV, dS in dK) and per query (dS in dQ) instead of one per 64x64 tile: cos >= 0.998
  // and rel-L1 <= 0.06 for dQ, dK and dV, f16 and bf16, causal or not. The per-tile scheme misses the rel-L1 bound on
  // dK (0.066-0.076 here), which the last check shows. sagebwd-rot-ks (per key only, as the mma.sync kernel runs it):
  // dK and dV as with both, dQ as per tile.
  forOutlierData([](const AccuracyOf &accuracy) {
    const GradientAccuracy tokens_scaled = accuracy("sagebwd-rot", true), tile_scaled = accuracy("sagebwd-rot", false);
    const GradientAccuracy key_scaled = accuracy("sagebwd-rot-ks", false);
    MESSAGE("per-token dq " << tokens_scaled.dq.cosine_similarity << " / " << tokens_scaled.dq.relative_l1 << ", dk "
                            << tokens_scaled.dk.cosine_similarity << " / " << tokens_scaled.dk.relative_l1 << ", dv "
                            << tokens_scaled.dv.cosine_similarity << " / " << tokens_scaled.dv.relative_l1
                            << "; per-tile dk " << tile_scaled.dk.relative_l1 << "; per-key dq "
                            << key_scaled.dq.relative_l1);
    for (const AccuracyMetrics *metrics : {&tokens_scaled.dq, &tokens_scaled.dk, &tokens_scaled.dv}) {
      CHECK(metrics->cosine_similarity >= 0.998);
      CHECK(metrics->relative_l1 <= 0.06);
    }
    CHECK(tile_scaled.dk.relative_l1 > 0.06);
    CHECK(key_scaled.dk.relative_l1 == tokens_scaled.dk.relative_l1);
    CHECK(key_scaled.dv.relative_l1 == tokens_scaled.dv.relative_l1);
    CHECK(key_scaled.dq.relative_l1 == tile_scaled.dq.relative_l1);
  });
}
