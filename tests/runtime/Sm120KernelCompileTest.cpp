// Every sm120 FP4 kernel (FP4 preset x head_dim x mask x input) generated and compiled with NVRTC and ptxas for
// sm_120f (what the runtime loads on 12.0 and 12.1) and sm_120a, the device library handed over as headers. No GPU
// needed. The PTX must hold the block-scaled mma for both matmuls, P's e2m1x2 packing and the cp.async pipeline,
// and ptxas may not spill. (The SASS is checked where cuobjdump exists: Sm120KernelSassTest.cpp.)
#include "Sm120Kernels.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

using namespace sage;

TEST_CASE("every sm120 FP4 kernel compiles for sm_120f and sm_120a to the block-scaled mma without spills") {
  const runtime::NvrtcCompiler nvrtc;
  int compiled = 0;
  for (const test::Sm120Kernel &kernel : test::sm120Kernels()) {
    CAPTURE(kernel.source.name);
    REQUIRE(kernel.source.uses_device_library);
    runtime::CompileRequest compile = test::sm120CompileRequest(kernel.source, "sm_120f");
    const runtime::ByteBuffer ptx_bytes = nvrtc.compilePtx(compile).image;
    const std::string ptx(ptx_bytes.begin(), ptx_bytes.end());
    CHECK(test::countOccurrences(ptx, kernel.mma) == kernel.mma_count);
    // P: one e2m1x2 per accumulator pair, (block_kv / 8) n8 tiles x 2 rows per lane.
    CHECK(test::countOccurrences(ptx, "cvt.rn.satfinite.e2m1x2.f32") ==
          static_cast<size_t>(kernel.plan.tunables.block_kv / 4));
    if (kernel.plan.fp4_scale_group == 16)
      CHECK(test::countOccurrences(ptx, "cvt.rn.satfinite.e4m3x2.f32") >= 1); // P's UE4M3 microscales
    CHECK(test::countOccurrences(ptx, "cp.async.cg.shared.global") >= 1);
    CHECK(test::countOccurrences(ptx, "cp.async.wait_group") >= 2);
    const runtime::CompileResult cubin = nvrtc.compileCubin(compile);
    REQUIRE(cubin.resources.size() == 1);
    CHECK(cubin.resources[0].spill_store_bytes == 0);
    std::printf("%s: %d registers, %d bytes spilled\n", kernel.source.name.c_str(), cubin.resources[0].registers,
                cubin.resources[0].spill_store_bytes);
    // The same text for the arch-specific target (12.0 only), which ptxas also accepts.
    compile.options.arch = "sm_120a";
    CHECK(!nvrtc.compileCubin(compile).image.empty());
    // The self-contained text (what `sagegen emit` writes) compiles to the same kernel without headers.
    compile.options.arch = "sm_120f";
    compile.headers.clear();
    compile.source = codegen::expandDeviceIncludes(kernel.source.source);
    CHECK(nvrtc.compileCubin(compile).image == cubin.image);
    ++compiled;
  }
  std::printf("sm120 FP4 kernels compiled for sm_120f and sm_120a: %d\n", compiled);
  CHECK(compiled == (test::fullSweeps() ? 24 : 6)); // all, or a quarter of each preset's (in CI)
}
