// Issue 28: one representative kernel per new head dim (32, 80, 96, 160, 192, 256) of the sm80 schedule, generated
// and compiled with NVRTC and ptxas as the runtime does it (no GPU needed), and the prologue's kernels of the two
// lane groups that leave lanes idle (d = 80: 10 vectors on 16 lanes; d = 192: 24 on 32). Not a sweep: the committed
// NVRTC sweeps keep d 64 and 128; `sagegen emit --preset P --headdim D --arch A --format cubin` compiles any other.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/Sm80Schedule.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

using namespace sage;

namespace {

struct Representative {
  const char *preset;
  int head_dim;
  MaskKind mask;
  schedules::InputType input;
  schedules::GpuArch arch;
  bool prologue; // compile the prologue's kernels too
};

// Compiles the variant's sm80 kernels; ptxas may spill a few bytes of the attention kernel at most (as in the sm90
// sweep: the d 64 int8 P.V kernels of sm_80 already spill up to 28 bytes).
void checkKernels(const Representative &r) {
  const AttentionVariant variant = test::presetVariant(r.preset, r.head_dim, r.mask, true);
  runtime::AttentionKernelRequest request;
  request.input = r.input;
  request.arch = r.arch;
  request.schedule = std::string(schedules::Sm80Schedule::kName);
  const runtime::AttentionKernelSet set = runtime::generateAttentionKernels(variant, request);
  const runtime::NvrtcCompiler nvrtc;
  for (const runtime::GeneratedKernel &kernel : set.kernels) {
    const bool attention = kernel.role == runtime::AttentionKernelRole::attention;
    if (!attention && !r.prologue)
      continue;
    CAPTURE(kernel.name);
    runtime::CompileRequest compile;
    compile.key = kernel.name;
    compile.source = runtime::selfContainedSource(kernel);
    compile.options.arch = std::string(schedules::archName(r.arch));
    compile.options.report_resources = true;
    const runtime::CompileResult cubin = nvrtc.compileCubin(compile);
    REQUIRE(!cubin.resources.empty());
    constexpr int kSpillBudgetBytes = 32;
    for (const runtime::KernelResources &resources : cubin.resources) {
      std::printf("%s: %d registers, %d bytes spilled\n", resources.kernel.c_str(), resources.registers,
                  resources.spill_store_bytes);
      CHECK(resources.spill_store_bytes <= kSpillBudgetBytes);
    }
  }
}

} // namespace

TEST_CASE("one kernel per new head dim compiles on the sm80 schedule within the spill budget") {
  using schedules::GpuArch;
  using schedules::InputType;
  const Representative representatives[] = {
      {"sage-vt", 32, MaskKind::causal, InputType::bf16, GpuArch::sm80, false},
      {"sage-b", 80, MaskKind::none, InputType::f16, GpuArch::sm80, true}, // int8 Q/K: a zero-filled half k32 step
      {"sage2-fp8", 96, MaskKind::none, InputType::bf16, GpuArch::sm89, false},
      {"sage-vb", 160, MaskKind::causal, InputType::f16, GpuArch::sm80, false}, // Q fragments from shared memory
      {"exact", 192, MaskKind::none, InputType::bf16, GpuArch::sm80, true},     // 16-bit Q/K rows padded to 512 B
      {"sage-t", 256, MaskKind::causal, InputType::f16, GpuArch::sm80, false},
  };
  for (const Representative &r : representatives) {
    CAPTURE(r.preset);
    CAPTURE(r.head_dim);
    checkKernels(r);
  }
}
