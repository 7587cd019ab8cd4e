// The packed (variable-length) prologue through NVRTC and ptxas, beside the dense prologue of the same variant: the
// presets that take packed batches, head dims 64 and 128, f16 and bf16, on sm_80 and sm_90a. Every kernel compiles
// without warnings and stays under the register cap of its __launch_bounds__. Launch 2's kernels run at the cap (80
// registers for 3 CTAs of 256 threads) and several dense ones spill there already; the packed kernel holds a few more
// values (a slot's first row and length) and ptxas' choices move both ways (measured: packed 36 bytes fewer to 20
// bytes more; sm_80 sage2-fp8 d128 f16 8 bytes where the dense kernel has none), so it may spill at most
// kSpillSlackBytes more than the dense kernel. The registers and spills of both are printed.
#include "../support/DeviceLibraryCompile.h"
#include "../support/SweepSubset.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <string>

using namespace sage;

namespace {

constexpr int kSpillSlackBytes = 24;

struct KernelUsage {
  bool compiled = false;
  std::string log;
  int registers = -1, spill_store_bytes = -1;
};

KernelUsage compile(const codegen::PrologueKernel &kernel, const char *arch) {
  test::NvrtcCompileOptions options;
  options.file_name = kernel.entry_point + ".cu";
  options.ptxas_report = true;
  const test::DeviceCompileResult result = test::compileWithNvrtc(kernel.source, arch, options);
  KernelUsage usage;
  usage.compiled = result.compiled;
  usage.log = result.log;
  const test::PtxasUsage ptxas = test::ptxasUsage(result.log);
  usage.registers = ptxas.registers;
  usage.spill_store_bytes = ptxas.spill_store_bytes;
  return usage;
}

// The log without ptxas' report: what is left must be empty (no warnings).
bool onlyPtxasReport(const std::string &log) {
  static const std::regex report(R"(ptxas[^\n]*\n?)");
  return std::regex_replace(log, report, "").find_first_not_of(" \n") == std::string::npos;
}

// In CI half of each preset's (head dim, input) combinations per arch, the other half on the other arch
// (tests/support/SweepSubset.h); all of them with SAGEGEN_FULL_SWEEPS=1.
void compilePackedPresets(const char *arch, int arch_index) {
  int compiled = 0;
  const char *const presets[] = {"sage-b", "sage-t", "sage-vb", "sage2-fp8", "sage2-int4", "exact"};
  for (int p = 0; p < 6; ++p)
    for (int head_dim : {64, 128})
      for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
        const int combination = (head_dim == 128 ? 2 : 0) + (input == schedules::InputType::bf16 ? 1 : 0);
        if (!test::sweepIncludes(p, arch_index, combination, 2))
          continue;
        const char *preset = presets[p];
        const AttentionVariant dense = dsl::preset(preset, head_dim)->describe();
        const AttentionVariant packed = packedSequencesOf(dense);
        const codegen::PrologueSource dense_prologue = codegen::PrologueGenerator::generate(dense, input, head_dim);
        const codegen::PrologueSource packed_prologue = codegen::PrologueGenerator::generate(packed, input, head_dim);
        REQUIRE(packed_prologue.kernels.size() == dense_prologue.kernels.size());
        for (size_t i = 0; i < packed_prologue.kernels.size(); ++i) {
          const codegen::PrologueKernel &kernel = packed_prologue.kernels[i];
          const std::string input_name = input == schedules::InputType::bf16 ? "bf16" : "f16";
          const std::string preset_name = preset;
          CAPTURE(preset_name);
          CAPTURE(head_dim);
          CAPTURE(input_name);
          CAPTURE(kernel.entry_point);
          const KernelUsage packed_usage = compile(kernel, arch);
          const KernelUsage dense_usage = compile(dense_prologue.kernels[i], arch);
          INFO(packed_usage.log);
          REQUIRE(packed_usage.compiled);
          REQUIRE(dense_usage.compiled);
          CHECK(onlyPtxasReport(packed_usage.log));
          REQUIRE(packed_usage.registers > 0);
          REQUIRE(packed_usage.spill_store_bytes >= 0);
          CHECK(packed_usage.spill_store_bytes <= dense_usage.spill_store_bytes + kSpillSlackBytes);
          // __launch_bounds__(kThreads, kMinCtasPerSm) caps both at 65536 / (threads * CTAs) registers.
          const int ctas = std::max(1, std::min(3, 768 / kernel.block_threads));
          CHECK(packed_usage.registers <= 65536 / (kernel.block_threads * ctas));
          std::printf("packed prologue %-10s d%-3d %-4s %-8s %-40s registers %3d (dense %3d), spill stores %3d bytes "
                      "(dense %3d)\n",
                      preset, head_dim, input_name.c_str(), arch, kernel.entry_point.c_str(), packed_usage.registers,
                      dense_usage.registers, packed_usage.spill_store_bytes, dense_usage.spill_store_bytes);
          ++compiled;
        }
      }
  CHECK(compiled >= 12); // 6 presets x 2 of their 4 combinations at least, one or two launches each
}

} // namespace

TEST_CASE("packed prologue kernels compile for sm_80") { compilePackedPresets("sm_80", 0); }
TEST_CASE("packed prologue kernels compile for sm_90a") { compilePackedPresets("sm_90a", 1); }
