// The LSE merge kernel (issue 30): its translation unit compiles with NVRTC and ptxas for sm_80 and sm_90a without
// spills (no GPU needed) for the element types ring attention uses and a rotating subset of the rest; one module
// name per element-type triple; the grid's CTA count.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/MergeKernels.h"

#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"

#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::codegen;

namespace {

constexpr MergeElement kElements[] = {MergeElement::f16, MergeElement::bf16, MergeElement::f32};

std::vector<MergeTypes> allTypes() {
  std::vector<MergeTypes> types;
  for (MergeElement a : kElements)
    for (MergeElement b : kElements)
      for (MergeElement out : kElements)
        types.push_back({a, b, out});
  return types;
}

// The triples ring attention runs: step 0's O with step 1's into the f32 accumulator (or, with two ranks, into the
// output), the accumulator with a step's O in place, and the last step into q's dtype.
bool ringTypes(const MergeTypes &types) {
  const bool half = types.b != MergeElement::f32;
  const bool first = types.a == types.b && (types.out == MergeElement::f32 || types.out == types.b); // W = 2: out
  const bool running = types.a == MergeElement::f32 && types.out == MergeElement::f32;
  const bool last = types.a == MergeElement::f32 && types.out == types.b;
  return half && (first || running || last);
}

} // namespace

TEST_CASE("every element-type triple has its own module name and instantiates its types") {
  std::set<std::string> names;
  for (const MergeTypes &types : allTypes()) {
    const MergeKernelSource kernel = generateMergeKernel(types);
    CHECK(names.insert(kernel.name).second);
    CHECK(kernel.source.find("#include \"sage/device/merge/merge.cuh\"") != std::string::npos);
  }
  CHECK(names.size() == 27);
  CHECK(generateMergeKernel({MergeElement::f32, MergeElement::bf16, MergeElement::f32}).name ==
        "sage_merge_a_f32_b_bf16_o_f32");
}

TEST_CASE("the merge kernel compiles for sm_80 and sm_90a without spills") {
  const std::vector<MergeTypes> types = allTypes();
  int compiled = 0;
  for (int t = 0; t < static_cast<int>(types.size()); ++t) {
    const char *archs[] = {"sm_80", "sm_90a"};
    for (int a = 0; a < 2; ++a) {
      if (!ringTypes(types[t]) && !test::sweepIncludes(0, a, t, 9))
        continue;
      const MergeKernelSource kernel = generateMergeKernel(types[t]);
      CAPTURE(kernel.name);
      CAPTURE(std::string(archs[a]));
      test::NvrtcCompileOptions options;
      options.file_name = kernel.name + ".cu";
      options.ptxas_report = true;
      const test::DeviceCompileResult result =
          test::compileWithNvrtc(expandDeviceIncludes(kernel.source), archs[a], options);
      INFO(result.log);
      REQUIRE(result.compiled);
      CHECK(result.cubin_bytes > 0);
      CHECK(result.log.find(std::string(kMergeKernel)) != std::string::npos);
      // ptxas: "0 bytes spill stores, 0 bytes spill loads" for the one kernel
      const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
      std::smatch match;
      REQUIRE(std::regex_search(result.log, match, spills));
      CHECK(match[1] == "0");
      CHECK(match[2] == "0");
      ++compiled;
    }
  }
  CHECK(compiled >= 16); // the ring's triples (4 per 16-bit type) on both archs at least
}

TEST_CASE("the merge grid gives every row its lanes and caps the CTAs") {
  // d = 128: 16 lanes per row, 2 rows per warp, 16 rows per CTA of 256 threads.
  CHECK(sage_merge_lanes_per_row(128) == 16);
  CHECK(sage_merge_lanes_per_row(8) == 1);
  CHECK(sage_merge_lanes_per_row(40) == 8);
  CHECK(sage_merge_lanes_per_row(256) == 32);
  CHECK(sage_merge_lanes_per_row(1024) == 32);
  CHECK(mergeGridCtas(16, 128) == 1);
  CHECK(mergeGridCtas(17, 128) == 2);
  CHECK(mergeGridCtas(1, 8) == 1);
  CHECK(mergeGridCtas(256, 8) == 1); // 32 rows per warp
  CHECK(mergeGridCtas(257, 8) == 2);
  CHECK(mergeGridCtas(1LL << 40, 128) == 1u << 20);
}
