// The reference's accuracy claims: SageAttn-B at the paper's Table 9 level on N(0,1) data, the vT/vB
// kernels visibly less accurate (as in Table 9), and K smoothing rescuing data with a large per-channel
// K bias (Table 18's effect). Bounds are the issue's; measured values are in the closing note.
#include "sage/dsl/Presets.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <cmath>
#include <string>

using namespace sage;
using namespace sage::reference;

namespace {

struct Workload {
  HostTensor q, k, v;
  AttentionResult exact;
};

Workload makeWorkload(int64_t tokens, int64_t dim, bool causal, double k_bias, uint64_t seed) {
  HostTensor q = randomTensor(1, 2, tokens, dim, StorageType::f16, Layout::hnd, {seed});
  HostTensor k = randomTensor(1, 2, tokens, dim, StorageType::f16, Layout::hnd, {seed + 1, 0.0, 1.0, k_bias});
  HostTensor v = randomTensor(1, 2, tokens, dim, StorageType::f16, Layout::hnd, {seed + 2});
  AttentionResult exact = exactAttention(q, k, v, causal);
  return {std::move(q), std::move(k), std::move(v), std::move(exact)};
}

AccuracyMetrics measure(const AttentionVariant &variant, const Workload &workload) {
  return compareOutputs(workload.exact.output, runReference(variant, workload.q, workload.k, workload.v).output);
}

AttentionVariant presetVariant(const char *name, int dim, MaskKind mask = MaskKind::none) {
  return dsl::preset(name, dim, mask)->lse().describe();
}

} // namespace

TEST_CASE("SageAttn-B and -T on N(0,1) data reach Table 9's level") {
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const Workload workload = makeWorkload(512, 128, causal, 0.0, 21);
    const MaskKind mask = causal ? MaskKind::causal : MaskKind::none;
    for (const char *name : {"sage-b", "sage-t"}) {
      const std::string preset_name = name;
      CAPTURE(preset_name);
      const AccuracyMetrics metrics = measure(presetVariant(name, 128, mask), workload);
      CHECK(metrics.cosine_similarity >= 0.9999);
      CHECK(metrics.relative_l1 <= 0.03);
    }
  }
}

TEST_CASE("the int8 P.V kernels are less accurate than the f16 ones, as in Table 9") {
  const Workload workload = makeWorkload(512, 64, false, 0.0, 31);
  const AccuracyMetrics b = measure(presetVariant("sage-b", 64), workload);
  const AccuracyMetrics vb = measure(presetVariant("sage-vb", 64), workload);
  const AccuracyMetrics fp8 = measure(presetVariant("sage2-fp8", 64), workload);
  CHECK(vb.relative_l1 > b.relative_l1);
  CHECK(fp8.relative_l1 > b.relative_l1);
  CHECK(vb.cosine_similarity >= 0.99); // Table 9: 98.9% on its data; ours is the easy N(0,1) case
  CHECK(fp8.cosine_similarity >= 0.999);
}

TEST_CASE("K smoothing rescues K with a large per-channel bias (Table 18's effect)") {
  const Workload workload = makeWorkload(512, 128, false, 20.0, 41);
  AttentionVariant smoothed = presetVariant("sage-b", 128);
  AttentionVariant unsmoothed = smoothed;
  unsmoothed.smooth_k = SmoothScope::none;
  unsmoothed.epilogue.lse_smoothing_correction = false;
  const AccuracyMetrics with = measure(smoothed, workload);
  const AccuracyMetrics without = measure(unsmoothed, workload);
  MESSAGE("with smoothing: cos " << with.cosine_similarity << " rel-L1 " << with.relative_l1 << "; without: cos "
                                 << without.cosine_similarity << " rel-L1 " << without.relative_l1);
  CHECK(with.cosine_similarity >= 0.9999);
  CHECK(with.relative_l1 <= 0.03);
  CHECK(without.relative_l1 > 5 * with.relative_l1);
  CHECK(without.cosine_similarity < 0.999);
  CHECK(without.cosine_similarity < with.cosine_similarity);
}

// Issue 28: the head dims beyond 64/128. Each forward preset keeps its accuracy class at every head dim on data with
// K offsets (bias 8, removed by smoothing), and its LSE is corrected back to the true one.
TEST_CASE("every forward preset at head dims 32..256 stays accurate on K offsets") {
  for (int dim : {32, 80, 96, 160, 192, 256}) {
    CAPTURE(dim);
    const Workload workload = makeWorkload(256, dim, false, 8.0, 91);
    for (const char *name : {"sage-b", "sage-t", "sage-vb", "sage-vt", "sage2-fp8", "exact"}) {
      const std::string preset_name = name;
      CAPTURE(preset_name);
      const AttentionResult result = runReference(presetVariant(name, dim), workload.q, workload.k, workload.v);
      const AccuracyMetrics metrics = compareOutputs(workload.exact.output, result.output);
      double worst_lse = 0.0;
      for (size_t i = 0; i < result.lse.size(); ++i)
        worst_lse = std::max(worst_lse, std::fabs(result.lse[i] - workload.exact.lse[i]));
      MESSAGE(preset_name << " d" << dim << ": cos " << metrics.cosine_similarity << " rel-L1 " << metrics.relative_l1
                          << " lse " << worst_lse);
      CHECK(metrics.cosine_similarity >= 0.999);
      CHECK(metrics.relative_l1 <= 0.05); // measured 0.008 (sage-t) .. 0.037 (sage2-fp8) at every head dim
      CHECK(worst_lse < 0.02);            // measured <= 0.009
    }
  }
}

TEST_CASE("the LSE of a smoothed-K kernel is corrected back to the true LSE") {
  const Workload workload = makeWorkload(256, 64, false, 8.0, 51);
  const AttentionResult result = runReference(presetVariant("sage-b", 64), workload.q, workload.k, workload.v);
  double worst = 0.0;
  for (size_t i = 0; i < result.lse.size(); ++i)
    worst = std::max(worst, std::fabs(result.lse[i] - workload.exact.lse[i]));
  CHECK(worst < 0.05);
}

TEST_CASE("the f16 accumulator is modelled: it changes O, slightly") {
  const Workload workload = makeWorkload(512, 64, false, 0.0, 61);
  AttentionVariant f16_accumulator = presetVariant("sage-b", 64);
  AttentionVariant f32_accumulator = f16_accumulator;
  f32_accumulator.pv.accumulator = AccumulatorType::f32;
  f32_accumulator.accumulation = {AccumulationKind::f32, 0};
  const AttentionResult f16_result = runReference(f16_accumulator, workload.q, workload.k, workload.v);
  const AttentionResult f32_result = runReference(f32_accumulator, workload.q, workload.k, workload.v);
  CHECK(f16_result.output != f32_result.output);
  const AccuracyMetrics between = compareOutputs(f32_result.output, f16_result.output);
  CHECK(between.relative_l1 < 5e-3); // Tables 4-5: no accuracy loss from the f16 accumulator
}

// SageAttention3's Table 1 and SageAttention2's Q smoothing, on N(0,1) data (the bounds are the issue's; the
// measured values are printed and quoted in the README).
TEST_CASE("FP4: NVFP4 beats MXFP4, two-level P beats direct P (SageAttention3's Table 1 effects)") {
  const Workload workload = makeWorkload(512, 128, false, 0.0, 71);
  const AccuracyMetrics two_level = measure(presetVariant("sage3-fp4", 128), workload);
  const AccuracyMetrics direct = measure(presetVariant("sage3-fp4-direct-p", 128), workload);
  const AccuracyMetrics mx = measure(presetVariant("sage3-mxfp4", 128), workload);
  MESSAGE("sage3-fp4 cos " << two_level.cosine_similarity << " rel-L1 " << two_level.relative_l1 << "; direct P cos "
                           << direct.cosine_similarity << " rel-L1 " << direct.relative_l1 << "; MXFP4 cos "
                           << mx.cosine_similarity << " rel-L1 " << mx.relative_l1);
  // On iid N(0,1) data attention is nearly uniform, so O is a small average of V and FP4's ~10% per-element error
  // of V (and of the weights) stays ~10-20% of O: cos 0.982 here, not the paper's 0.995 on real data.
  CHECK(two_level.cosine_similarity >= 0.98);
  CHECK(two_level.relative_l1 < direct.relative_l1);
  CHECK(two_level.cosine_similarity > direct.cosine_similarity);
  // NVFP4 against MXFP4 with the same (direct) P: only the format differs.
  CHECK(direct.relative_l1 < mx.relative_l1);
  CHECK(direct.cosine_similarity > mx.cosine_similarity);
}

TEST_CASE("INT4: Q smoothing makes sage2-int4 more accurate (SageAttention2)") {
  const Workload workload = makeWorkload(512, 128, false, 0.0, 81);
  const AccuracyMetrics smoothed = measure(presetVariant("sage2-int4", 128), workload);
  const AccuracyMetrics unsmoothed = measure(presetVariant("sage2-int4-no-smooth-q", 128), workload);
  MESSAGE("sage2-int4 cos " << smoothed.cosine_similarity << " rel-L1 " << smoothed.relative_l1
                            << "; without Q smoothing cos " << unsmoothed.cosine_similarity << " rel-L1 "
                            << unsmoothed.relative_l1);
  CHECK(smoothed.relative_l1 < unsmoothed.relative_l1);
  CHECK(smoothed.cosine_similarity > unsmoothed.cosine_similarity);
  // iid N(0,1) Q has block means near 0, so the gain above is small; Q with a per-channel bias shared by its
  // tokens (the outliers SageAttention2 smooths away) shows the effect plainly.
  Workload biased = makeWorkload(512, 128, false, 0.0, 81);
  biased.q = randomTensor(1, 2, 512, 128, StorageType::f16, Layout::hnd, {85, 0.0, 1.0, 4.0});
  biased.exact = exactAttention(biased.q, biased.k, biased.v, false);
  const AccuracyMetrics smoothed_biased = measure(presetVariant("sage2-int4", 128), biased);
  const AccuracyMetrics unsmoothed_biased = measure(presetVariant("sage2-int4-no-smooth-q", 128), biased);
  MESSAGE("Q with channel bias 4: sage2-int4 cos " << smoothed_biased.cosine_similarity << " rel-L1 "
                                                   << smoothed_biased.relative_l1 << "; without Q smoothing cos "
                                                   << unsmoothed_biased.cosine_similarity << " rel-L1 "
                                                   << unsmoothed_biased.relative_l1);
  CHECK(smoothed_biased.relative_l1 < unsmoothed_biased.relative_l1);
}
