// Parsing of ptxas's -v report (the format NVRTC returns in its log with --ptxas-options=-v).
#include "sage/runtime/PtxasResources.h"

#include <doctest/doctest.h>

using namespace sage::runtime;

TEST_CASE("one block per entry function, with registers, stack, spills, smem and barriers") {
  const char *log = "ptxas info    : 0 bytes gmem\n"
                    "ptxas info    : Compiling entry function '_Z4tinyILi3EEvv' for 'sm_90a'\n"
                    "ptxas info    : Function properties for _Z4tinyILi3EEvv\n"
                    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                    "ptxas info    : Used 8 registers, used 0 barriers\n"
                    "ptxas info    : Compile time = 1.957 ms\n"
                    "ptxas info    : Compiling entry function 'attention' for 'sm_90a'\n"
                    "ptxas info    : Function properties for attention\n"
                    "ptxas         .     264 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
                    "ptxas info    : Used 255 registers, used 2 barriers, 264 bytes cumulative stack size, "
                    "49152 bytes smem, 368 bytes cmem[0]\n";
  std::vector<KernelResources> kernels = parsePtxasResources(log);
  REQUIRE(kernels.size() == 2);
  CHECK(kernels[0].kernel == "_Z4tinyILi3EEvv");
  CHECK(kernels[0].registers == 8);
  CHECK(kernels[0].static_shared_bytes == 0);
  CHECK(kernels[1].kernel == "attention");
  CHECK(kernels[1].registers == 255);
  CHECK(kernels[1].barriers == 2);
  CHECK(kernels[1].stack_frame_bytes == 264);
  CHECK(kernels[1].spill_store_bytes == 24);
  CHECK(kernels[1].spill_load_bytes == 16);
  CHECK(kernels[1].static_shared_bytes == 49152);
}

TEST_CASE("the properties of a called device function are not the kernel's") {
  const char *log = "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
                    "ptxas info    : Function properties for _Z6helperv\n"
                    "ptxas         .     512 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads\n"
                    "ptxas info    : Function properties for k\n"
                    "ptxas         .     8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                    "ptxas info    : Used 40 registers, used 1 barriers, 8 bytes cumulative stack size\n";
  std::vector<KernelResources> kernels = parsePtxasResources(log);
  REQUIRE(kernels.size() == 1);
  CHECK(kernels[0].stack_frame_bytes == 8);
  CHECK(kernels[0].spill_store_bytes == 0);
  CHECK(kernels[0].registers == 40);
}

TEST_CASE("a log without a ptxas report gives no kernels") {
  CHECK(parsePtxasResources("").empty());
  CHECK(
      parsePtxasResources("kernel.cu(3): warning #177-D: variable \"x\" was declared but never referenced\n").empty());
}
