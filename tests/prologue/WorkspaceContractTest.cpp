// The workspace contract seen from both generated kernels, for every preset (exact included), head_dim
// {64, 128}, causal or not, with an LSE, input {f16, bf16}: every buffer the attention kernel reads is reserved by
// computeWorkspaceLayout and written by one of the prologue's launches, and the attention kernel's Q and K row
// bytes are those of the layout (head_dim bytes of codes, or head_dim x 2 bytes for an unquantized operand). The
// attention kernel's reads are sage::device::sm80::WorkspaceReads<Config> (sage/device/sm80/attention.cuh, the
// conditions under which the kernel reads each params.offsets.X), checked by static_asserts that NVRTC's front end
// compiles after the generated kernel.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/WorkspaceLayout.h"

#include "../support/DeviceLibraryCompile.h"

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

using namespace sage;
using schedules::BufferSlice;
using schedules::InputType;

namespace {

bool contains(const std::string &text, const std::string &needle) { return text.find(needle) != std::string::npos; }

schedules::ProblemShape shapeFor(int head_dim) {
  schedules::ProblemShape shape;
  shape.batch = 2;
  shape.heads_q = 4;
  shape.heads_kv = 2;
  shape.tokens_q = 300;
  shape.tokens_kv = 333;
  shape.head_dim = head_dim;
  return shape;
}

std::vector<std::pair<std::string, BufferSlice>> buffersOf(const schedules::WorkspaceLayout &layout) {
  return {{"q_codes", layout.q_codes},   {"q_scales", layout.q_scales}, {"k_codes", layout.k_codes},
          {"k_scales", layout.k_scales}, {"k_mean", layout.k_mean},     {"q_mean", layout.q_mean},
          {"v_values", layout.v_values}, {"v_codes", layout.v_codes},   {"v_scales", layout.v_scales},
          {"v_mean", layout.v_mean},     {"delta_s", layout.delta_s}};
}

// NVRTC's front end on the generated kernel followed by `assertions`; its errors, empty when it compiles.
std::string frontEndErrors(const codegen::KernelSource &kernel, const std::string &assertions) {
  const test::DeviceCompileResult result = test::compileWithDeviceLibrary(
      kernel.source + "\n" + assertions, std::string(schedules::archName(kernel.arch)), true);
  return result.compiled ? std::string() : result.log.empty() ? std::string("compilation failed") : result.log;
}

} // namespace

TEST_CASE("the attention kernel reads only what the layout reserves and the prologue writes, rows included") {
  int checked = 0;
  for (const dsl::PresetInfo &info : dsl::presets())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (InputType input : {InputType::f16, InputType::bf16}) {
          const AttentionVariant variant = dsl::preset(info.name, head_dim, mask)->lse().describe();
          const std::string preset(info.name);
          const std::string input_name(schedules::nameOf(input));
          CAPTURE(preset);
          CAPTURE(head_dim);
          CAPTURE(input_name);
          const schedules::KernelPlan plan =
              schedules::planBestSchedule(variant, schedules::GpuArch::sm89, input); // sm_89: FP8 P.V too
          const codegen::KernelSource attention = codegen::AttentionKernelGenerator::generate(variant, plan, input);
          std::string prologue;
          for (const codegen::PrologueKernel &kernel :
               codegen::PrologueGenerator::generate(variant, input, head_dim).kernels)
            prologue += kernel.source;
          const schedules::ProblemShape shape = shapeFor(head_dim);
          const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, shape, input);

          // Every buffer the kernel reads is reserved and written by the prologue: those that are not, it must not
          // read.
          std::string assertions = "using Reads = sage::device::sm80::WorkspaceReads<Config>;\n";
          for (const auto &[name, slice] : buffersOf(layout))
            if (!(slice.bytes > 0 && contains(prologue, "params.offsets." + name)))
              assertions += "static_assert(!Reads::" + name + ", \"" + name + "\");\n";
          // The attention kernel reads Q_i and K_j as rows of kQRowBytes / kKRowBytes, kBlockQ / kBlockKv rows
          // after the previous block, from padded, token-major buffers of padded_q / padded_kv rows per head.
          const size_t q_row_bytes = layout.q_codes.bytes / static_cast<size_t>(8 * layout.padded_q);
          const size_t k_row_bytes = layout.k_codes.bytes / static_cast<size_t>(4 * layout.padded_kv);
          const size_t operand_bytes = variant.q.quantized() ? 1 : 2;
          CHECK(q_row_bytes == static_cast<size_t>(head_dim) * operand_bytes);
          CHECK(k_row_bytes == static_cast<size_t>(head_dim) * operand_bytes);
          assertions += "static_assert(Reads::kQRowBytes == " + std::to_string(q_row_bytes) +
                        " && Reads::kKRowBytes == " + std::to_string(k_row_bytes) + ", \"rows\");\n";
          CHECK(frontEndErrors(attention, assertions) == "");
          if (mask == MaskKind::none && head_dim == 64 && input == InputType::f16) // the check can fail
            CHECK(frontEndErrors(attention, "static_assert(sage::device::sm80::WorkspaceReads<Config>::q_mean);") !=
                  "");
          // f16 P.V reads the caller's V only when the prologue leaves it alone.
          if (plan.v_source == schedules::ValueSource::input)
            CHECK(layout.v_values.bytes == 0);
          ++checked;
        }
  CHECK(checked == 48);
}
