// Every sm120 FP4 kernel (FP4 preset x head_dim x mask x input) generated and compiled with NVRTC and ptxas for
// sm_120f (what the runtime loads on 12.0 and 12.1) and sm_120a, the device library handed over as headers. No GPU
// needed. The PTX must hold the block-scaled mma for both matmuls, P's e2m1x2 packing and the cp.async pipeline,
// and ptxas may not spill. (The SASS is checked where cuobjdump exists: Sm120KernelSassTest.cpp.)
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/DeviceLibrary.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/Sm120Schedule.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

using namespace sage;

namespace {

size_t count(const std::string &text, const std::string &word) {
  size_t found = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    ++found;
  return found;
}

runtime::CompileRequest compileRequest(const codegen::KernelSource &kernel, const std::string &arch) {
  runtime::CompileRequest compile;
  compile.key = kernel.name;
  compile.source = kernel.source;
  compile.options.arch = arch;
  compile.options.report_resources = true;
  for (const codegen::DeviceHeader &header : codegen::deviceLibrary())
    compile.headers.emplace_back(std::string(header.name), std::string(header.text));
  return compile;
}

} // namespace

TEST_CASE("every sm120 FP4 kernel compiles for sm_120f and sm_120a to the block-scaled mma without spills") {
  const schedules::Sm120Schedule schedule;
  const runtime::NvrtcCompiler nvrtc;
  int compiled = 0;
  for (const char *preset : {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4"})
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
          const AttentionVariant variant = test::presetVariant(preset, head_dim, mask, true);
          REQUIRE(schedule.supports(variant, schedules::GpuArch::sm120f, input));
          const schedules::KernelPlan plan = schedule.plan(variant, schedules::GpuArch::sm120f, input);
          const codegen::KernelSource kernel = codegen::AttentionKernelGenerator::generate(variant, plan, input);
          CAPTURE(kernel.name);
          REQUIRE(kernel.uses_device_library);
          runtime::CompileRequest compile = compileRequest(kernel, "sm_120f");
          const runtime::ByteBuffer ptx_bytes = nvrtc.compilePtx(compile).image;
          const std::string ptx(ptx_bytes.begin(), ptx_bytes.end());
          const bool nvfp4 = plan.fp4_scale_group == 16;
          const std::string mma = nvfp4 ? "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::"
                                          "4X.f32.e2m1.e2m1.f32.ue4m3"
                                        : "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::"
                                          "2X.f32.e2m1.e2m1.f32.ue8m0";
          // Q.K^T: (block_kv / 8) x (d / 64) mmas; P.V: (d / 8) x (block_kv / 64), all unrolled.
          const size_t expected_mmas = static_cast<size_t>(plan.tunables.block_kv / 8 * (head_dim / 64) +
                                                           head_dim / 8 * (plan.tunables.block_kv / 64));
          CHECK(count(ptx, mma) == expected_mmas);
          // P: one e2m1x2 per accumulator pair, (block_kv / 8) n8 tiles x 2 rows per lane.
          CHECK(count(ptx, "cvt.rn.satfinite.e2m1x2.f32") == static_cast<size_t>(plan.tunables.block_kv / 4));
          if (nvfp4)
            CHECK(count(ptx, "cvt.rn.satfinite.e4m3x2.f32") >= 1); // P's UE4M3 microscales
          CHECK(count(ptx, "cp.async.cg.shared.global") >= 1);
          CHECK(count(ptx, "cp.async.wait_group") >= 2);
          const runtime::CompileResult cubin = nvrtc.compileCubin(compile);
          REQUIRE(cubin.resources.size() == 1);
          CHECK(cubin.resources[0].spill_store_bytes == 0);
          std::printf("%s: %d registers, %d bytes spilled\n", kernel.name.c_str(), cubin.resources[0].registers,
                      cubin.resources[0].spill_store_bytes);
          // The same text for the arch-specific target ptxas also knows (12.0 only).
          compile.options.arch = "sm_120a";
          CHECK(!nvrtc.compileCubin(compile).image.empty());
          // The self-contained text (what `sagegen emit` writes) compiles to the same kernel without headers.
          compile.options.arch = "sm_120f";
          compile.headers.clear();
          compile.source = codegen::expandDeviceIncludes(kernel.source);
          CHECK(nvrtc.compileCubin(compile).image == cubin.image);
          ++compiled;
        }
  std::printf("sm120 FP4 kernels compiled for sm_120f and sm_120a: %d\n", compiled);
  CHECK(compiled == 24);
}
