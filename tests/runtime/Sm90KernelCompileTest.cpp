// Every sm90 kernel (preset x head_dim x mask x input) generated and compiled for sm_90a with NVRTC and ptxas, the
// device library handed over as headers, as the runtime does it. No GPU needed. The PTX must use wgmma, TMA and
// setmaxnreg (a kernel that compiled to something else would be on a slower path), and ptxas may spill a few bytes
// at most (int8 P.V keeps an s32 block product beside the f32 sum: sage-vt d128 spills 4 bytes).
#include "sage/codegen/DeviceLibrary.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/Sm90Schedule.h"

#include "../codegen/TestVariants.h"
#include "../support/SweepSubset.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <utility>

using namespace sage;

namespace {

size_t count(const std::string &text, const std::string &word) {
  size_t found = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    ++found;
  return found;
}

// Generates the variant's sm90 kernel, compiles it as the runtime does and checks what it compiled to. Returns its PTX
// and the bytes ptxas spilled.
std::pair<std::string, int> checkSm90Kernel(const AttentionVariant &variant, schedules::InputType input) {
  runtime::AttentionKernelRequest request;
  request.input = input;
  request.arch = schedules::GpuArch::sm90a;
  request.schedule = std::string(schedules::Sm90Schedule::kName);
  const runtime::AttentionKernelSet set = runtime::generateAttentionKernels(variant, request);
  const runtime::GeneratedKernel &kernel = set.kernels.back();
  CAPTURE(kernel.name);
  REQUIRE(kernel.uses_device_library);
  // The plan's CTAs per SM bound the registers ptxas may use (two: 128 per thread before the hand-over)
  CHECK(kernel.source.find("__launch_bounds__(" + std::to_string(set.plan.threads) + ", " +
                           std::to_string(set.plan.min_blocks_per_multiprocessor) + ")") != std::string::npos);
  runtime::CompileRequest compile;
  compile.key = kernel.name;
  compile.source = kernel.source;
  compile.options.arch = "sm_90a";
  compile.options.report_resources = true;
  for (const codegen::DeviceHeader &header : codegen::deviceLibrary())
    compile.headers.emplace_back(std::string(header.name), std::string(header.text));
  const runtime::NvrtcCompiler nvrtc;
  const runtime::ByteBuffer ptx_bytes = nvrtc.compilePtx(compile).image;
  const std::string ptx(ptx_bytes.begin(), ptx_bytes.end());
  CHECK(count(ptx, "wgmma.mma_async.sync.aligned.m64n") >= 2);
  CHECK(count(ptx, "cp.async.bulk.tensor") >= 3);
  CHECK(count(ptx, "mbarrier.try_wait.parity") >= 2);
  // One consumer warpgroup alone on its SM has registers to spare: no hand-over
  CHECK(count(ptx, "setmaxnreg") == (set.plan.warp_specialization.producer_registers > 0 ? 2 : 0));
  const runtime::CompileResult cubin = nvrtc.compileCubin(compile);
  REQUIRE(cubin.resources.size() == 1);
  // ptxas serializes wgmma it cannot prove safe to overlap ("C7514/C7518 Potential Performance Loss:
  // wgmma.mma_async instructions are serialized"): the pipeline would silently lose its overlap.
  CHECK(cubin.log.find("are serialized") == std::string::npos);
  constexpr int kSpillBudgetBytes = 32;
  CHECK(cubin.resources[0].spill_store_bytes <= kSpillBudgetBytes);
  // The self-contained text (what `sagegen emit` writes) compiles to the same kernel without headers.
  compile.headers.clear();
  compile.source = runtime::selfContainedSource(kernel);
  CHECK(nvrtc.compileCubin(compile).image == cubin.image);
  std::printf("%s: %d registers, %d bytes spilled\n", kernel.name.c_str(), cubin.resources[0].registers,
              cubin.resources[0].spill_store_bytes);
  return {ptx, cubin.resources[0].spill_store_bytes};
}

} // namespace

// In CI half of each preset's (head dim, mask, input) combinations, alternating the input between presets
// (../support/SweepSubset.h); SAGEGEN_FULL_SWEEPS=1 compiles all of them.
TEST_CASE("every sm90 kernel compiles for sm_90a to wgmma + TMA without spills") {
  int compiled = 0;
  const std::vector<std::string> presets = test::presetNames();
  for (int p = 0; p < static_cast<int>(presets.size()); ++p)
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
          const AttentionVariant variant = test::presetVariant(presets[p], head_dim, mask, true);
          if (!schedules::Sm90Schedule().supports(variant, schedules::GpuArch::sm90a, input))
            continue;
          const int combination = (head_dim == 128 ? 4 : 0) + (mask == MaskKind::causal ? 2 : 0) +
                                  (input == schedules::InputType::bf16 ? 1 : 0);
          if (!test::sweepIncludes(p, 0, combination, 2))
            continue;
          checkSm90Kernel(variant, input);
          ++compiled;
        }
  std::printf("sm90 kernels compiled for sm_90a: %d\n", compiled);
  CHECK(compiled >= (test::fullSweeps() ? 24 : 12));
}

// Head dims 192 and 256 (issue 28): P.V over column slices of V where an f32 or s32 m64 x d accumulator would not fit
// (an outer sum folded one slice at a time, inline loads), an f16 O in one wgmma of n = d, int8 Q/K rows of 192 bytes
// in 64-byte swizzled chunks. Six kernels (CI time): the main presets, causal or not, f16 and bf16, none spilling.
TEST_CASE("sm90 kernels at head_dim 192 and 256 compile to wgmma + TMA without spills") {
  struct WideCase {
    const char *preset;
    int head_dim;
    MaskKind mask;
    schedules::InputType input;
    const char *pv_wgmma; // the P.V instruction's shape and types
  };
  const WideCase cases[] = {
      {"sage-b", 256, MaskKind::causal, schedules::InputType::f16, "m64n256k16.f16.f16.f16"},
      {"sage-b", 192, MaskKind::none, schedules::InputType::bf16, "m64n192k16.f16.f16.f16"},
      {"sage2-fp8", 256, MaskKind::none, schedules::InputType::bf16, "m64n128k32.f32.e4m3.e4m3"},
      {"sage2-fp8", 192, MaskKind::causal, schedules::InputType::f16, "m64n96k32.f32.e4m3.e4m3"},
      {"sage-vb", 256, MaskKind::causal, schedules::InputType::f16, "m64n128k32.s32.s8.s8"},
      {"exact", 256, MaskKind::none, schedules::InputType::f16, "m64n128k16.f32.f16.f16"},
  };
  for (const WideCase &item : cases) {
    CAPTURE(item.preset);
    CAPTURE(item.head_dim);
    const AttentionVariant variant = test::presetVariant(item.preset, item.head_dim, item.mask, true);
    REQUIRE(schedules::Sm90Schedule().supports(variant, schedules::GpuArch::sm90a, item.input));
    const auto [ptx, spilled] = checkSm90Kernel(variant, item.input);
    CHECK(count(ptx, std::string("wgmma.mma_async.sync.aligned.") + item.pv_wgmma) >= 1);
    CHECK(spilled == 0);
  }
}

// Block-sparse kernels walk a mask row in shared memory from both warp roles: the consumers' loop bound comes from
// shared memory, which must not cost the wgmma overlap. Every preset at d = 128 (f16) and d = 64 (bf16), and the
// sparse parts of the SLA presets (64 x 64 blocks: one consumer warpgroup, two CTAs per SM), f16 as the SLA runner
// calls them.
TEST_CASE("block-sparse sm90 kernels compile to wgmma + TMA without spills") {
  int compiled = 0;
  for (const std::string &preset : test::presetNames())
    for (auto [head_dim, input] : {std::pair{128, schedules::InputType::f16}, {64, schedules::InputType::bf16}}) {
      const AttentionVariant variant = test::presetVariant(preset, head_dim, MaskKind::block_sparse, true);
      REQUIRE(schedules::Sm90Schedule().supports(variant, schedules::GpuArch::sm90a, input));
      checkSm90Kernel(variant, input);
      ++compiled;
    }
  for (const dsl::PresetInfo &info : dsl::slaPresets())
    for (int head_dim : {64, 128}) {
      CAPTURE(std::string(info.name));
      AttentionVariant sparse = dsl::preset(info.name, head_dim)->describe();
      sparse.sla = SlaSpec{};
      REQUIRE(schedules::Sm90Schedule().supports(sparse, schedules::GpuArch::sm90a, schedules::InputType::f16));
      checkSm90Kernel(sparse, schedules::InputType::f16);
      ++compiled;
    }
  std::printf("block-sparse sm90 kernels compiled for sm_90a: %d\n", compiled);
  CHECK(compiled >= 18);
}

// One consumer warpgroup whose stages do not fit twice in shared memory runs alone on its SM, keeping its registers;
// one that fits twice shares the SM with a second CTA and takes the producer's registers (setmaxnreg).
TEST_CASE("one consumer warpgroup compiles without the register hand-over when it is alone on its SM") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128, MaskKind::causal, true);
  runtime::AttentionKernelRequest request;
  request.arch = schedules::GpuArch::sm90a;
  request.schedule = std::string(schedules::Sm90Schedule::kName);
  request.tunables = schedules::Tunables{64, 128, 4, 4}; // 8 KiB of Q + 4 x 48 KiB of K/V
  const runtime::GeneratedKernel kernel = runtime::generateAttentionKernels(variant, request).kernels.back();
  runtime::CompileRequest compile;
  compile.key = kernel.name;
  compile.source = runtime::selfContainedSource(kernel);
  compile.options.arch = "sm_90a";
  const runtime::ByteBuffer ptx_bytes = runtime::NvrtcCompiler().compilePtx(compile).image;
  const std::string ptx(ptx_bytes.begin(), ptx_bytes.end());
  CHECK(count(ptx, "wgmma.mma_async.sync.aligned.m64n128") >= 2);
  CHECK(count(ptx, "setmaxnreg") == 0);

  request.tunables = schedules::Tunables{64, 64, 4, 2}; // 8 KiB of Q + 2 x 24 KiB: two CTAs per SM
  compile.source = runtime::selfContainedSource(runtime::generateAttentionKernels(variant, request).kernels.back());
  const runtime::ByteBuffer shared_ptx = runtime::NvrtcCompiler().compilePtx(compile).image;
  CHECK(count(std::string(shared_ptx.begin(), shared_ptx.end()), "setmaxnreg") == 2);
}
