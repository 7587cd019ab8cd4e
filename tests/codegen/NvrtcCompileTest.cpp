// Every preset x head_dim {64, 128} x mask {none, causal} x input {f16, bf16} x arch {sm_80, sm_89, sm_90a, sm_100f,
// sm_120f} is generated and compiled to a cubin with NVRTC (libnvrtc directly: no GPU or driver needed). ptxas' report
// (--ptxas-options=-v, in the NVRTC log) gives the registers and spills of each kernel.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/Sm80Schedule.h"

#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"
#include "TestVariants.h"

#include <doctest/doctest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

namespace {

// Spills the fastest measured configurations accept (sage-b d128 at 128 registers: ~100 bytes).
constexpr int kSpillBudgetBytes = 256;

struct Case {
  std::string preset;
  int head_dim;
  MaskKind mask;
  InputType input;
  GpuArch arch;
  std::optional<AccumulationSpec> accumulation = {}; // the preset's, unless given
};

struct Outcome {
  std::string name;
  bool compiled = false;
  std::string log;
  int registers = -1, spill_store_bytes = -1;
  size_t cubin_bytes = 0;
};

Outcome compile(const Case &item) {
  AttentionVariant variant = test::presetVariant(item.preset, item.head_dim, item.mask, true);
  if (item.accumulation)
    variant.accumulation = *item.accumulation;
  const KernelSource kernel =
      AttentionKernelGenerator::generate(variant, Sm80Schedule::full().plan(variant, item.arch, item.input));
  Outcome outcome;
  outcome.name = kernel.name;
  // The kernel #includes the device library's sm80 steps: NVRTC receives the library as headers, as in the runtime.
  test::NvrtcCompileOptions options;
  options.file_name = kernel.name + ".cu";
  options.ptxas_report = true;
  const test::DeviceCompileResult result =
      test::compileWithNvrtc(kernel.source, std::string(archName(item.arch)), options);
  outcome.compiled = result.compiled;
  outcome.cubin_bytes = result.cubin_bytes;
  outcome.log = result.log;
  const test::PtxasUsage usage = test::ptxasUsage(outcome.log);
  outcome.registers = usage.registers;
  outcome.spill_store_bytes = usage.spill_store_bytes;
  return outcome;
}

// Compiles the cases on up to 4 threads; each must compile within the spill budget.
void compileAndCheck(const std::vector<Case> &cases) {
  const std::vector<Outcome> outcomes = test::compileInParallel(cases, compile);

  for (size_t index = 0; index < cases.size(); ++index) {
    const Outcome &outcome = outcomes[index];
    CAPTURE(outcome.name);
    CAPTURE(archName(cases[index].arch));
    INFO(outcome.log);
    CHECK(outcome.compiled);
    CHECK(outcome.cubin_bytes > 0);
    CHECK(outcome.registers > 0);
    CHECK(outcome.spill_store_bytes >= 0);
    CHECK(outcome.spill_store_bytes <= kSpillBudgetBytes);
    std::printf("%-52s %-7s registers %3d spill stores %3d bytes\n", outcome.name.c_str(),
                std::string(archName(cases[index].arch)).c_str(), outcome.registers, outcome.spill_store_bytes);
  }
}

} // namespace

TEST_CASE("every preset compiles for sm_80, sm_89, sm_90a, sm_100f and sm_120f within the spill budget") {
  // In CI a quarter of the (head dim, mask, input) combinations of each preset and arch, both head dims among them
  // (tests/support/SweepSubset.h); SAGEGEN_FULL_SWEEPS=1 compiles all of them.
  std::vector<Case> cases;
  const GpuArch archs[] = {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f};
  const std::vector<std::string> presets = test::presetNames();
  for (int p = 0; p < static_cast<int>(presets.size()); ++p)
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (InputType input : {InputType::f16, InputType::bf16})
          for (int a = 0; a < 5; ++a) {
            const AttentionVariant variant = test::presetVariant(presets[p], head_dim, mask);
            const SupportResult support = Sm80Schedule().supports(variant, archs[a], input);
            if (!support) { // only FP8 P.V on sm_80 is expected here
              CHECK(presets[p] == "sage2-fp8");
              CHECK(archs[a] == GpuArch::sm80);
              continue;
            }
            const int combination =
                (head_dim == 128 ? 4 : 0) + (mask == MaskKind::causal ? 2 : 0) + (input == InputType::bf16 ? 1 : 0);
            if (test::sweepIncludes(p, a, combination, 4))
              cases.push_back({presets[p], head_dim, mask, input, archs[a]});
          }
  REQUIRE(cases.size() == (test::fullSweeps() ? 6 * 2 * 2 * 2 * 5 - 2 * 2 * 2 : 6 * 5 * 2 - 2));

  compileAndCheck(cases);
}

TEST_CASE("issue 11's INT4 presets (int4 decoded to int8, Q smoothing's delta_s) compile wherever the sm80 schedule "
          "runs them") {
  std::vector<Case> cases;
  for (const dsl::PresetInfo &info : dsl::referenceOnlyPresets())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (InputType input : {InputType::f16, InputType::bf16})
          for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f}) {
            const std::string preset(info.name);
            const AttentionVariant variant = test::presetVariant(preset, head_dim, mask);
            if (variant.q.dtype != ElementType::int4)
              continue;
            // The INT4 presets' e4m3 P.V needs sm_89.
            CHECK(static_cast<bool>(Sm80Schedule::full().supports(variant, arch, input)) == (arch != GpuArch::sm80));
            if (arch != GpuArch::sm80)
              cases.push_back({preset, head_dim, mask, input, arch});
          }
  REQUIRE(cases.size() == 2 * 2 * 2 * 2 * 4);
  compileAndCheck(cases);
}

TEST_CASE("issue 11's FP4 presets compile by emulation (decoded to f16/bf16, 16-bit mma.sync) where the legalization "
          "decodes FP4") {
  std::vector<Case> cases;
  for (const dsl::PresetInfo &info : dsl::referenceOnlyPresets())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f}) {
          const std::string preset(info.name);
          const AttentionVariant variant = test::presetVariant(preset, head_dim, mask);
          if (variant.q.dtype != ElementType::e2m1)
            continue;
          // sm_120f multiplies FP4 natively: its legalized program has nothing to emulate.
          CHECK(static_cast<bool>(Sm80Schedule::full().supports(variant, arch, InputType::f16)) ==
                !hasFp4BlockScaledMma(arch));
          if (hasFp4BlockScaledMma(arch))
            continue;
          CHECK_FALSE(Sm80Schedule().supports(variant, arch, InputType::f16)); // the sm90 schedule's numerics check
          // The kernel reads only the prologue's codes: the input type changes the output's packing alone, so bf16
          // inputs are compiled for one arch.
          cases.push_back({preset, head_dim, mask, InputType::f16, arch});
          if (arch == GpuArch::sm90a)
            cases.push_back({preset, head_dim, mask, InputType::bf16, arch});
        }
  REQUIRE(cases.size() == 3 * 2 * 2 * 5);
  compileAndCheck(cases);
}

TEST_CASE("an f16 accumulator flushed into f32 every few KV blocks (f16_then_f32, no preset uses it) compiles") {
  // sage/device/sm80/two_level.cuh's f16 branch (f16x2 words unpacked into the f32 sums); the presets cover its f32
  // branch (sage2-fp8, the INT4 presets).
  const AccumulationSpec two_level{AccumulationKind::f16_then_f32, 4};
  compileAndCheck({{"sage-b", 128, MaskKind::causal, InputType::f16, GpuArch::sm80, two_level},
                   {"sage-t", 64, MaskKind::none, InputType::bf16, GpuArch::sm89, two_level}});
}
