// SageBwd's kernels (issue 12) through NVRTC: sagebwd (K smoothed, issue 25) x head_dim {64, 128} x mask {none,
// causal} x input {f16, bf16} x arch {sm_80, sm_89, sm_90a, sm_100f, sm_120f} x every backward schedule that supports
// the arch compile to cubins (libnvrtc only: no GPU or driver). ptxas' report gives each kernel's registers and spills;
// the wgmma main kernel must not spill (its dK/dV accumulators fill most of the register file). The rotated backward
// (sagebwd-rot, issue 25) on the two archs whose schedules differ, both head dims and input types, with per-tile,
// per-key (sagebwd-rot-ks) and per-key plus per-query (sagebwd-rot-qks) P/dS scales, and per-query ones alone.
#include "sage/codegen/BackwardKernelGenerator.h"
#include "sage/codegen/DeviceLibrary.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/schedules/BackwardSchedule.h"

#include "../support/DeviceLibraryCompile.h"

#include <doctest/doctest.h>
#include <nvrtc.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>

using namespace sage;
using namespace sage::schedules;

namespace {

test::DeviceCompileResult compile(const std::string &source, const std::string &name, GpuArch arch) {
  test::NvrtcCompileOptions options;
  options.file_name = name + ".cu";
  options.ptxas_report = true;
  return test::compileWithNvrtc(source, std::string(archName(arch)), options);
}

// Prints ptxas' report of each kernel of a module and checks that the wgmma main kernel does not spill: its dK/dV sums
// and products fill the register file (255 at d = 128), a spill would sit in its hot loop. One report per kernel:
// "Function properties for x / N bytes stack frame, N bytes spill stores, ... / Used N registers" (the registers bound
// the CTAs per SM: 2 at 255 x 128 threads).
// One ptxas report per kernel: (1) its name, (2) stack frame bytes, (3) spill store bytes, (4) registers.
const std::regex &ptxasReport() {
  static const std::regex report(R"(Function properties for (\w+)\s*\nptxas\s+\.\s+(\d+) bytes stack frame, (\d+) )"
                                 R"(bytes spill stores[^\n]*\nptxas info\s*: Used (\d+) registers)");
  return report;
}

void checkReports(const std::string &log, const std::string &module, GpuArch arch, const BackwardSchedule &schedule) {
  for (std::sregex_iterator it(log.begin(), log.end(), ptxasReport()), end; it != end; ++it) {
    std::printf("%-64s %-7s %-24s registers %3s stack %4s spill stores %4s bytes\n", module.c_str(),
                std::string(archName(arch)).c_str(), (*it)[1].str().c_str(), (*it)[4].str().c_str(),
                (*it)[2].str().c_str(), (*it)[3].str().c_str());
    if (schedule.name() == "sm90.wgmma_backward" && (*it)[1].str() == "sage_bwd_main")
      CHECK_MESSAGE((*it)[3].str() == "0", "sm90 sage_bwd_main spills");
  }
}

// sage_bwd_main's spill stores (bytes) in a ptxas log; -1 without its report.
int mainSpillStores(const std::string &log) {
  for (std::sregex_iterator it(log.begin(), log.end(), ptxasReport()), end; it != end; ++it)
    if ((*it)[1].str() == "sage_bwd_main")
      return std::stoi((*it)[3].str());
  return -1;
}

// sage_bwd_main's stack frame (bytes: spills, and register arrays indexed at run time) in a ptxas log; -1 without it.
int mainStackBytes(const std::string &log) {
  for (std::sregex_iterator it(log.begin(), log.end(), ptxasReport()), end; it != end; ++it)
    if ((*it)[1].str() == "sage_bwd_main")
      return std::stoi((*it)[2].str());
  return -1;
}

} // namespace

TEST_CASE("the rotated SageBwd kernels (issue 25) compile, the wgmma main kernel without spills") {
  for (int head_dim : {64, 128})
    for (InputType input : {InputType::f16, InputType::bf16})
      for (GpuArch arch : {GpuArch::sm80, GpuArch::sm90a})
        for (const BackwardSchedule *schedule : allBackwardSchedules()) {
          const BackwardVariant variant =
              dsl::backwardPreset("sagebwd-rot", head_dim, MaskKind::causal)
                  ->float_type(input == InputType::bf16 ? ElementType::bf16 : ElementType::f16)
                  .describe();
          if (!schedule->supports(variant, arch, input))
            continue;
          const codegen::BackwardKernelSource kernel =
              codegen::BackwardKernelGenerator::generate(variant, schedule->plan(variant, arch, input));
          CAPTURE(kernel.name);
          const test::DeviceCompileResult outcome =
              compile(codegen::expandDeviceIncludes(kernel.source), kernel.name, arch);
          INFO(outcome.log);
          REQUIRE(outcome.compiled);
          checkReports(outcome.log, kernel.name, arch, *schedule);
        }
}

TEST_CASE("per-key and per-query P/dS scales (issue 25): the kernels of both schedules compile, the wgmma one without "
          "spills") {
  // Spills: the d = 128 mma.sync main kernel already spills a few bytes at 255 registers (12 on sm_80, 4 on sm_90a
  // when the per-key scales were written); the per-key scales (two dV and two dK scales per thread instead of one)
  // may add at most 64 bytes (56 on sm_80, none on sm_90a then), the per-query dS scales for dQ (sagebwd-rot-qks; and
  // alone, token_scales(false, true)) at most 64 more. The wgmma main kernel must not spill (checkReports).
  struct Scales {
    bool per_key, per_query;
  };
  for (int head_dim : {64, 128})
    for (InputType input : {InputType::f16, InputType::bf16})
      for (GpuArch arch : {GpuArch::sm80, GpuArch::sm90a}) {
        dsl::AttentionBackwardBuilder builder = *dsl::backwardPreset("sagebwd-rot", head_dim, MaskKind::causal);
        builder.float_type(input == InputType::bf16 ? ElementType::bf16 : ElementType::f16);
        const BackwardVariant per_tile = builder.build().variant();
        for (const BackwardSchedule *schedule : allBackwardSchedules()) {
          if (!schedule->supports(per_tile, arch, input))
            continue;
          const codegen::BackwardKernelSource baseline =
              codegen::BackwardKernelGenerator::generate(per_tile, schedule->plan(per_tile, arch, input));
          const test::DeviceCompileResult baseline_outcome =
              compile(codegen::expandDeviceIncludes(baseline.source), baseline.name, arch);
          REQUIRE(baseline_outcome.compiled);
          const int baseline_spills = mainSpillStores(baseline_outcome.log);
          REQUIRE(baseline_spills >= 0);
          int key_spills = baseline_spills; // the per-key kernel's, which the per-query scales come on top of
          int key_stack = mainStackBytes(baseline_outcome.log);
          for (Scales scales : {Scales{true, false}, Scales{true, true}, Scales{false, true}}) {
            if (!scales.per_key && input == InputType::bf16)
              continue; // per-query scales alone: f16 suffices (the kernel code does not depend on the input type)
            const BackwardVariant variant =
                dsl::AttentionBackwardBuilder(builder).token_scales(scales.per_key, scales.per_query).build().variant();
            CHECK(bestBackwardSchedule(variant, arch, input).name() ==
                  bestBackwardSchedule(per_tile, arch, input).name());
            REQUIRE(schedule->supports(variant, arch, input));
            const codegen::BackwardKernelSource kernel =
                codegen::BackwardKernelGenerator::generate(variant, schedule->plan(variant, arch, input));
            CAPTURE(kernel.name);
            CHECK(kernel.plan.key_scales == scales.per_key);
            CHECK(kernel.plan.query_scales == scales.per_query);
            const test::DeviceCompileResult outcome =
                compile(codegen::expandDeviceIncludes(kernel.source), kernel.name, arch);
            INFO(outcome.log);
            REQUIRE(outcome.compiled);
            checkReports(outcome.log, kernel.name, arch, *schedule);
            const int spills = mainSpillStores(outcome.log);
            std::printf("%-72s %-7s sage_bwd_main spill stores %d bytes (per-tile scales: %d)\n", kernel.name.c_str(),
                        std::string(archName(arch)).c_str(), spills, baseline_spills);
            REQUIRE(spills >= 0);
            const int stack = mainStackBytes(outcome.log);
            if (!scales.per_query) {
              CHECK(spills <= baseline_spills + 64);
              key_spills = spills;
              key_stack = stack;
            } else {
              const int before_spills = scales.per_key ? key_spills : baseline_spills;
              const int before_stack = scales.per_key ? key_stack : mainStackBytes(baseline_outcome.log);
              CHECK(spills <= before_spills + 64);
              // the per-query maxima stay in registers: the stack grows by spill slots only (a run-time index into a
              // register array would put it on the stack without a spill)
              CHECK(stack - before_stack <= std::max(0, spills - before_spills));
            }
          }
        }
      }
}

TEST_CASE("the SageBwd kernels of every schedule compile for sm_80, sm_89, sm_90a, sm_100f and sm_120f") {
  for (int head_dim : {64, 128})
    for (MaskKind mask : {MaskKind::none, MaskKind::causal})
      for (InputType input : {InputType::f16, InputType::bf16})
        for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f})
          for (const BackwardSchedule *schedule : allBackwardSchedules()) {
            const BackwardVariant variant =
                dsl::backwardPreset("sagebwd", head_dim, mask)
                    ->float_type(input == InputType::bf16 ? ElementType::bf16 : ElementType::f16)
                    .describe();
            if (!schedule->supports(variant, arch, input))
              continue;
            const codegen::BackwardKernelSource kernel =
                codegen::BackwardKernelGenerator::generate(variant, schedule->plan(variant, arch, input));
            CAPTURE(kernel.name);
            const test::DeviceCompileResult outcome =
                compile(codegen::expandDeviceIncludes(kernel.source), kernel.name, arch);
            INFO(outcome.log);
            REQUIRE(outcome.compiled);
            CHECK(outcome.cubin_bytes > 0);
            for (const BackwardLaunch &launch : kernel.plan.launches)
              CHECK_MESSAGE(outcome.log.find(launch.entry_point) != std::string::npos, launch.entry_point);
            checkReports(outcome.log, kernel.name, arch, *schedule);
          }
}
