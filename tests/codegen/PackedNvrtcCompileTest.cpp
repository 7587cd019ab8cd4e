// The attention kernels of packed variable-length batches (KernelPlan::packed_sequences: Config::kPackedSequences)
// compiled with NVRTC and ptxas for sm_90a (the wgmma kernels: persistent with a producer warpgroup, and inline loads)
// and for sm_80 / sm_89 (mma.sync), each beside the dense kernel of the same plan: the packed kernel must compile,
// stay within the registers its launch bounds give, spill no more than the dense one, and (wgmma) keep its wgmma
// overlapped. The GPU tests check what they compute.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/Sm90Schedule.h"

#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"
#include "TestVariants.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

namespace {

constexpr int kRegisterFile = 65536; // 32-bit registers per SM on sm_80 .. sm_90
// The packed kernels hold a few per-sequence values in registers where the dense ones read the constant bank. Kernels
// already at their register limit (and spilling) spill a little more (measured with CUDA 13, packed against dense
// bytes: sage2-fp8 d64 causal on sm_89 64 / 44, sage-vt d64 on sm_89 24 / 12, sage2-fp8 d128 causal on sm_90a with
// inline loads 12 / 8; most kernels 0 / 0).
constexpr int kSpillToleranceBytes = 24;

struct Case {
  std::string preset;
  int head_dim;
  MaskKind mask;
  InputType input;
  GpuArch arch;
  bool packed;
};

struct Outcome {
  std::string name, log;
  bool compiled = false;
  int registers = -1, spill_store_bytes = -1, register_limit = 0;
  bool persistent = false, inline_loads = false;
};

KernelPlan planOf(const Case &item, const AttentionVariant &variant) {
  KernelPlan plan = item.arch == GpuArch::sm90a ? Sm90Schedule().plan(variant, item.arch, item.input)
                                                : Sm80Schedule().plan(variant, item.arch, item.input);
  plan.packed_sequences = item.packed;
  return plan;
}

Outcome compile(const Case &item) {
  const AttentionVariant variant = test::presetVariant(item.preset, item.head_dim, item.mask, true);
  const KernelPlan plan = planOf(item, variant);
  const KernelSource kernel = AttentionKernelGenerator::generate(variant, plan);
  Outcome outcome;
  outcome.name = kernel.name;
  outcome.persistent = plan.grid.persistent_ctas_per_multiprocessor > 0;
  outcome.inline_loads =
      plan.warp_specialization.consumer_warpgroups > 0 && !plan.warp_specialization.producer_warpgroup;
  outcome.register_limit = kRegisterFile / (plan.threads * std::max(1, plan.min_blocks_per_multiprocessor));
  // The Config follows the plan (a kernel that ignored the flag would compile the dense paths twice)
  const std::string source = kernel.source +
                             "\nstatic_assert(Config::kPackedSequences == " + (item.packed ? "true" : "false") +
                             ", \"the plan's packed_sequences\");\n";
  test::NvrtcCompileOptions options;
  options.file_name = kernel.name + ".cu";
  options.ptxas_report = true;
  const test::DeviceCompileResult result = test::compileWithNvrtc(source, std::string(archName(item.arch)), options);
  outcome.compiled = result.compiled && result.cubin_bytes > 0;
  outcome.log = result.log;
  const test::PtxasUsage usage = test::ptxasUsage(outcome.log);
  outcome.registers = usage.registers;
  outcome.spill_store_bytes = usage.spill_store_bytes;
  return outcome;
}

// Each (preset, head dim, mask, input) the schedule supports, dense and packed side by side (cases 2i and 2i + 1). In
// CI one input per (preset, head dim, mask), alternating, so that each preset compiles both; SAGEGEN_FULL_SWEEPS=1
// compiles both inputs everywhere.
std::vector<Case> casesFor(GpuArch arch, const Schedule &schedule) {
  std::vector<Case> cases;
  const std::vector<std::string> &presets = test::presetNames();
  for (int p = 0; p < static_cast<int>(presets.size()); ++p)
    for (int d = 0; d < 2; ++d)
      for (int m = 0; m < 2; ++m)
        for (InputType input : {InputType::f16, InputType::bf16}) {
          if (!test::fullSweeps() && (input == InputType::bf16) != ((p + d + m) % 2 == 1))
            continue;
          const int head_dim = d == 0 ? 64 : 128;
          const MaskKind mask = m == 0 ? MaskKind::none : MaskKind::causal;
          const AttentionVariant variant = test::presetVariant(presets[p], head_dim, mask, true);
          if (!schedule.supports(variant, arch, input))
            continue;
          for (bool packed : {false, true})
            cases.push_back({presets[p], head_dim, mask, input, arch, packed});
        }
  return cases;
}

void checkPackedAgainstDense(const std::vector<Case> &cases) {
  REQUIRE(!cases.empty());
  const std::vector<Outcome> outcomes = test::compileInParallel(cases, compile);
  for (size_t index = 0; index + 1 < cases.size(); index += 2) {
    const Outcome &dense = outcomes[index], &packed = outcomes[index + 1];
    CAPTURE(packed.name);
    CAPTURE(archName(cases[index].arch));
    INFO(packed.log);
    REQUIRE(dense.compiled);
    REQUIRE(packed.compiled);
    CHECK(packed.name != dense.name); // both may live in one module
    CHECK(packed.registers > 0);
    CHECK(packed.registers <= packed.register_limit);
    CHECK(packed.spill_store_bytes >= 0);
    CHECK(packed.spill_store_bytes <= dense.spill_store_bytes + kSpillToleranceBytes);
    if (cases[index].arch == GpuArch::sm90a) // ptxas serializing wgmma would lose the pipeline's overlap
      CHECK(packed.log.find("are serialized") == std::string::npos);
    std::printf("%-60s %-7s%s registers %3d (dense %3d) spill stores %3d (dense %3d) bytes\n", packed.name.c_str(),
                std::string(archName(cases[index].arch)).c_str(),
                packed.inline_loads ? " inline    " : (packed.persistent ? " persistent" : "           "),
                packed.registers, dense.registers, packed.spill_store_bytes, dense.spill_store_bytes);
  }
}

} // namespace

TEST_CASE("packed-sequence wgmma kernels (persistent and inline loads) compile for sm_90a like their dense ones") {
  const std::vector<Case> cases = casesFor(GpuArch::sm90a, Sm90Schedule());
  bool persistent = false, inline_loads = false;
  for (const Case &item : cases) {
    const KernelPlan plan = planOf(item, test::presetVariant(item.preset, item.head_dim, item.mask, true));
    persistent = persistent || plan.grid.persistent_ctas_per_multiprocessor > 0;
    inline_loads = inline_loads || !plan.warp_specialization.producer_warpgroup;
  }
  CHECK(persistent); // both ways a tile is fed are compiled
  CHECK(inline_loads);
  checkPackedAgainstDense(cases);
}

TEST_CASE("packed-sequence mma.sync kernels compile for sm_80 and sm_89 like their dense ones") {
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89})
    checkPackedAgainstDense(casesFor(arch, Sm80Schedule()));
}
