// The head dim a call runs at (runtime/src/HeadDimChoice.cpp, sage_attention_head_dim): decided by the schedules'
// supports() on each arch, without a GPU.
#include "../../runtime/src/HeadDimChoice.h"

#include <doctest/doctest.h>

using namespace sage;
using schedules::GpuArch;

namespace {

int runAt(std::string_view preset, int head_dim, int64_t tokens_kv, GpuArch arch, bool block_mask = false,
          std::string_view schedule = {}) {
  return runtime::runHeadDim({preset, head_dim, tokens_kv, arch, schedules::InputType::f16, block_mask, schedule});
}

} // namespace

TEST_CASE("dims with a kernel keep their dim on every arch") {
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm120f})
    for (int dim : {64, 128, 192, 256}) {
      CAPTURE(dim);
      CHECK(runAt("sage-b", dim, 16384, arch) == dim);
    }
  CHECK(runAt("sage-b", 160, 16384, GpuArch::sm80) == 160);
  CHECK(runAt("sage-b", 160, 1024, GpuArch::sm90a) == 160); // short: the mma.sync kernel at the real d
  CHECK(runAt("sage-b", 96, 16384, GpuArch::sm80) == 96);
  CHECK(runAt("sage-b", 96, 16384, GpuArch::sm89) == 96);
}

TEST_CASE("on sm_90a the measured presets pad long calls to the wgmma kernels' next dim") {
  for (std::string_view preset : {"sage-b", "sage2-fp8"}) {
    CAPTURE(preset);
    CHECK(runAt(preset, 80, 4096, GpuArch::sm90a) == 128);
    CHECK(runAt(preset, 112, 16384, GpuArch::sm90a) == 128);
    CHECK(runAt(preset, 48, 4096, GpuArch::sm90a) == 64);
    CHECK(runAt(preset, 80, 4095, GpuArch::sm90a) == 80); // short: the real d's kernel was faster
    // Above 128 the wgmma kernels' next dim: 160 -> 192 is 1.2x the work, against mma.sync kernels at the real d
    // that ran 0.46-0.59x cuDNN (sage-b, run 35)
    CHECK(runAt(preset, 144, 16384, GpuArch::sm90a) == 192);
    CHECK(runAt(preset, 160, 4096, GpuArch::sm90a) == 192);
    CHECK(runAt(preset, 224, 16384, GpuArch::sm90a) == 256);
  }
  // sage2-fp8 has no mma.sync kernel above 128 on Hopper (two-level accumulation): padded at any length
  CHECK(runAt("sage2-fp8", 160, 128, GpuArch::sm90a) == 192);
  CHECK(runAt("sage-b", 32, 16384, GpuArch::sm90a) == 32); // measured no faster padded
  CHECK(runAt("sage2-fp8", 32, 16384, GpuArch::sm90a) == 64);
  CHECK(runAt("sage-t", 80, 16384, GpuArch::sm90a) == 80);                         // not measured: unchanged
  CHECK(runAt("sage-b", 80, 16384, GpuArch::sm90a, false, "sm80.mma_sync") == 80); // a forced schedule
  CHECK(runAt("sage-b", 80, 16384, GpuArch::sm90a, true) == 80);                   // block-sparse
  CHECK(runAt("sage-b", 80, 16384, GpuArch::sm80) == 80);                          // no wgmma
}

TEST_CASE("dims without a kernel are padded to the next one; what no kernel takes is left to the runner") {
  CHECK(runAt("sage-b", 72, 128, GpuArch::sm90a) == 128); // PixArt's 72, any length: the wgmma kernel's dim
  CHECK(runAt("sage2-fp8", 40, 128, GpuArch::sm90a) == 64);
  CHECK(runAt("sage-b", 72, 128, GpuArch::sm80) == 80);
  CHECK(runAt("sage-b", 8, 128, GpuArch::sm89) == 32);
  CHECK(runAt("sage-b", 200, 128, GpuArch::sm90a) == 256); // no kernel at 200: the wgmma kernels' next dim
  CHECK(runAt("sage-b", 200, 128, GpuArch::sm80) == 208);
  CHECK(runAt("sage-t", 72, 16384, GpuArch::sm90a) == 80); // not measured on wgmma: the next dim with a kernel
  CHECK(runAt("sage-b", 72, 128, GpuArch::sm90a, false, "sm90.wgmma_tma") == 128); // the forced schedule's dims
  for (int refused : {36, 100, 264, 0, -8}) {
    CAPTURE(refused);
    CHECK(runAt("sage-b", refused, 128, GpuArch::sm90a) == refused);
  }
  CHECK(runAt("no-such-preset", 72, 128, GpuArch::sm90a) == 72);
  CHECK(runAt("sage-b", 72, 128, GpuArch::sm90a, false, "no.such_schedule") == 72);
}
