// SlaRunner's host-side rules for the backward's saved statistics (issue 13), without a GPU: the O^s argument's checks
// and the SLA module's delta kernel (which sparse parts are exact: tests/ir/SlaSparsePartTest.cpp).
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
