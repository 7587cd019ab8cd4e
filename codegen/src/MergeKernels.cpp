// The translation unit of the LSE merge kernel: the element types and one extern "C" entry point around the device
// library's template (sage/device/merge/merge.cuh).
#include "sage/codegen/MergeKernels.h"

#include <fmt/format.h>

#include <algorithm>

namespace sage::codegen {

std::string_view nameOf(MergeElement element) {
  switch (element) {
  case MergeElement::f16:
    return "f16";
  case MergeElement::bf16:
    return "bf16";
  case MergeElement::f32:
    return "f32";
  }
  return "?";
}

namespace {

std::string_view macroOf(MergeElement element) {
  switch (element) {
  case MergeElement::f16:
    return "SAGE_MERGE_F16";
  case MergeElement::bf16:
    return "SAGE_MERGE_BF16";
  case MergeElement::f32:
    return "SAGE_MERGE_F32";
  }
  return "?";
}

} // namespace

MergeKernelSource generateMergeKernel(const MergeTypes &types) {
  MergeKernelSource kernel;
  kernel.name = fmt::format("sage_merge_a_{}_b_{}_o_{}", nameOf(types.a), nameOf(types.b), nameOf(types.out));
  kernel.source = fmt::format(
      R"(// The LSE merge of two partial attention results: O_a {a}, O_b {b}, out {out}; LSEs f32.
#include "sage/device/merge/merge.cuh"

extern "C" __global__ void __launch_bounds__({threads}, {min_blocks}) {entry}(const SageMergeParams p) {{
  sage::device::merge::merge_rows<{a_macro}, {b_macro}, {out_macro}>(p);
}}
)",
      fmt::arg("a", nameOf(types.a)), fmt::arg("b", nameOf(types.b)), fmt::arg("out", nameOf(types.out)),
      fmt::arg("threads", kMergeThreads), fmt::arg("min_blocks", kMergeMinBlocks), fmt::arg("entry", kMergeKernel),
      fmt::arg("a_macro", macroOf(types.a)), fmt::arg("b_macro", macroOf(types.b)),
      fmt::arg("out_macro", macroOf(types.out)));
  return kernel;
}

unsigned mergeGridCtas(long long rows, int head_dim) {
  const long long rows_per_cta = kMergeThreads / 32 * (32 / sage_merge_lanes_per_row(head_dim));
  // Past 2^20 CTAs (2^23 rows and more at d = 128) the CTAs loop: more would only wait for an SM.
  constexpr long long kMostCtas = 1 << 20;
  return static_cast<unsigned>(std::clamp((rows + rows_per_cta - 1) / rows_per_cta, 1LL, kMostCtas));
}

} // namespace sage::codegen
