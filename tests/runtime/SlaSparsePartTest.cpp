// SlaRunner's host-side rules for the backward's saved statistics (issue 13), without a GPU: which sparse parts are
// exact (their forward writes the LSE the backward reads instead of recomputing it) and the O^s argument's checks.
#include "sage/codegen/SlaKernels.h"
#include "sage/dsl/Presets.h"
#include "sage/runtime/SlaRunner.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

using namespace sage;

namespace {

AttentionVariant presetVariant(const char *name, int head_dim = 128) { return dsl::preset(name, head_dim)->describe(); }

std::string refusal(const SageTensorStrides &strides, const schedules::ProblemShape &shape) {
  try {
    runtime::checkSlaSparseOutputStrides(strides, shape);
  } catch (const std::invalid_argument &error) {
    return error.what();
  }
  return "";
}

} // namespace

TEST_CASE("the exact SLA presets' sparse parts write their LSE, a quantized one does not") {
  for (int head_dim : {64, 128}) {
    CAPTURE(head_dim);
    for (const char *name : {"sla-f16", "sla-f16-elu"}) {
      CAPTURE(std::string(name));
      const AttentionVariant variant = presetVariant(name, head_dim);
      CHECK(runtime::slaSparsePartIsExact(variant));
      const AttentionVariant sparse = runtime::slaSparsePart(variant);
      CHECK_FALSE(sparse.sla.enabled);
      CHECK(sparse.epilogue.write_lse);
      CHECK_FALSE(sparse.epilogue.lse_smoothing_correction); // no K smoothing: L is that of S / sqrt(d) as it is
      AttentionVariant expected = variant;                   // everything else as the variant says
      expected.sla = SlaSpec{};
      expected.epilogue.write_lse = true;
      CHECK(sparse == expected);
    }
    const AttentionVariant int8 = presetVariant("sla-int8", head_dim);
    CHECK_FALSE(runtime::slaSparsePartIsExact(int8));
    const AttentionVariant sparse = runtime::slaSparsePart(int8);
    CHECK_FALSE(sparse.sla.enabled);
    CHECK_FALSE(sparse.epilogue.write_lse);
  }
}

TEST_CASE("any quantizer, smoothing or f16 accumulator makes the sparse part inexact") {
  const AttentionVariant exact = presetVariant("sla-f16");
  REQUIRE(runtime::slaSparsePartIsExact(exact));
  AttentionVariant variant = exact;
  variant.smooth_k = SmoothScope::sequence;
  CHECK_FALSE(runtime::slaSparsePartIsExact(variant));
  variant = exact;
  variant.v.granularity = Granularity::per_channel;
  CHECK_FALSE(runtime::slaSparsePartIsExact(variant));
  variant = exact;
  variant.p.static_scale = 1.0 / 127.0;
  CHECK_FALSE(runtime::slaSparsePartIsExact(variant));
  variant = exact;
  variant.q.dtype = ElementType::int8;
  CHECK_FALSE(runtime::slaSparsePartIsExact(variant));
  variant = exact;
  variant.pv.accumulator = AccumulatorType::f16;
  CHECK_FALSE(runtime::slaSparsePartIsExact(variant));
}

TEST_CASE("O^s's strides for the backward are checked, naming them") {
  const schedules::ProblemShape shape{1, 4, 2, 1000, 1500, 128};
  CHECK(refusal({4 * 1000 * 128, 1000 * 128, 128}, shape).empty()); // HND
  CHECK(refusal({1000 * 4 * 128, 128, 4 * 128}, shape).empty());    // NHD
  for (const SageTensorStrides &bad :
       {SageTensorStrides{4 * 1000 * 128, 1000 * 128, 64}, SageTensorStrides{4 * 1000 * 128, 0, 128},
        SageTensorStrides{-1, 1000 * 128, 128}}) {
    const std::string message = refusal(bad, shape);
    CAPTURE(message);
    CHECK(message.find("tensors.o_sparse_strides") == 0);
    CHECK(message.find("at least head_dim (128)") != std::string::npos);
  }
}

TEST_CASE("the SLA module has the delta kernel that replaces the statistics kernel after a saved LSE") {
  const codegen::SlaKernelSource kernel = codegen::generateSlaKernels(presetVariant("sla-f16"));
  CHECK(std::count(kernel.entry_points.begin(), kernel.entry_points.end(), codegen::kSlaSparseDeltaKernel) == 1);
  CHECK(std::count(kernel.entry_points.begin(), kernel.entry_points.end(), codegen::kSlaSparseStatisticsKernel) == 1);
  CHECK(kernel.source.find(std::string(codegen::kSlaSparseDeltaKernel) + "(const SageSlaSparseDeltaParams p)") !=
        std::string::npos);
}
