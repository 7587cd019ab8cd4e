// The device library's self-contained headers (codegen/device): each compiles alone with NVRTC, after only the
// kernel ABI (what a generated kernel declares before the library), so a header includes what it uses. And the sm80
// PTX wrappers (sage/device/sm80/instructions.cuh) and the shared conversions (sage/device/conversions.cuh) go
// through ptxas for sm_80 and sm_89 in a kernel that calls each of them.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/KernelAbiSource.h"

#include "../support/DeviceLibraryCompile.h"

#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

using namespace sage::codegen;

namespace {

using sage::test::DeviceCompileResult;

DeviceCompileResult compile(const std::string &source, const std::string &arch, bool syntax_only) {
  return sage::test::compileWithDeviceLibrary(source, arch, syntax_only);
}

} // namespace

TEST_CASE("each self-contained device header compiles alone after the kernel ABI") {
  const char *headers[] = {
      "sage/device/conversions.cuh",
      "sage/device/lanes.cuh",
      "sage/device/hadamard.cuh",
      "sage/device/sequences.cuh",
      "sage/device/fp4/microscaling.cuh",
      "sage/device/sm80/instructions.cuh",
      "sage/device/sm80/layout.cuh",
      "sage/device/sm80/tile_helpers.cuh",
      "sage/device/sm80/geometry.cuh",
      "sage/device/sm80/score_steps.cuh",
      "sage/device/sm80/softmax.cuh",
      "sage/device/sm80/value_steps_f16.cuh",
      "sage/device/sm80/value_steps_codes.cuh",
      "sage/device/sm80/two_level.cuh",
      "sage/device/sm80/fp4_steps.cuh",
      "sage/device/sm80/epilogue.cuh",
      "sage/device/sm80/attention.cuh",
      "sage/device/merge/abi.cuh",
      "sage/device/merge/merge.cuh",
  };
  for (const char *header : headers) {
    CAPTURE(header);
    REQUIRE(findDeviceHeader(header) != nullptr);
    const DeviceCompileResult result =
        compile(std::string(kernelAbiSource()) + "\n#include \"" + header + "\"\n", "sm_80", true);
    INFO(result.log);
    CHECK(result.compiled);
  }
  // The check can fail: a header that does not exist, and a use of a name no header declared.
  CHECK_FALSE(compile("#include \"sage/device/sm80/no_such_header.cuh\"\n", "sm_80", true).compiled);
  CHECK_FALSE(
      compile("#include \"sage/device/lanes.cuh\"\n__device__ float f() { return fast_exp2(1.0f); }\n", "sm_80", true)
          .compiled);
}

TEST_CASE("the sm80 PTX wrappers and the shared conversions assemble for sm_80 and sm_89") {
  const std::string common = R"(#include "sage/device/conversions.cuh"
#include "sage/device/sm80/instructions.cuh"
using namespace sage::device;
using namespace sage::device::sm80;
extern "C" __global__ void wrappers(const unsigned *in, float *out, int *codes, unsigned *words) {
  __shared__ __align__(128) unsigned char tile[1024];
  const unsigned shared = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  cp_async_16(shared + threadIdx.x * 16, in + threadIdx.x * 4, threadIdx.x < 32);
  cp_async_4(shared + 512 + threadIdx.x * 4, in + threadIdx.x);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned a[4], b[2];
  ldmatrix_x4(a, shared + (threadIdx.x % 16) * 16);
  ldmatrix_x2(b, shared + (threadIdx.x % 16) * 16);
  unsigned t[4];
  ldmatrix_x4_trans(t, shared + (threadIdx.x % 16) * 16);
  int s32[4] = {0, 0, 0, 0};
  mma_m16n8k32_s8_s32(s32, a, b[0], b[1]);
  float f32[4] = {0, 0, 0, 0};
  mma_m16n8k16_f16_f32(f32, a, t[0], t[1]);
  mma_m16n8k16_bf16_f32(f32, t, b[0], b[1]);
  unsigned f16[2] = {0, 0};
  mma_m16n8k16_f16_f16(f16, a, b[0], b[1]);
  float low, high;
  unpack_f16x2(scale_f16x2(f16[0], pack_f16x2(0.5f, 0.5f)), low, high);
  out[threadIdx.x] = fast_exp2(f32[0]) + fast_log2(f32[1]) + low + high + decode_input_element<true>(7) +
                     decode_input_element<false>(7);
  codes[threadIdx.x] = s32[0];
  words[threadIdx.x] = pack_bf16x2(f32[2], f32[3]) ^ pack_s8x4(f32[0], f32[1], f32[2], f32[3]) ^ f16[1]@E4M3@;
}
)";
  const auto with_e4m3 = [&](bool e4m3) {
    std::string text = common;
    const std::string slot = "@E4M3@";
    text.replace(text.find(slot), slot.size(),
                 e4m3 ? " ^ pack_e4m3x4(f32[0], 1, 2, 3);\n  mma_m16n8k32_e4m3_f32(f32, a, b[0], b[1]);\n"
                        "  out[threadIdx.x + 32] = f32[0]"
                      : "");
    return text;
  };
  for (const auto &[arch, e4m3] : {std::pair{"sm_80", false}, std::pair{"sm_89", true}}) {
    CAPTURE(arch);
    const DeviceCompileResult result = compile(with_e4m3(e4m3), arch, false);
    INFO(result.log);
    CHECK(result.compiled);
    CHECK(result.cubin_bytes > 0);
  }
  // ptxas refuses the e4m3 instructions before sm_89: the wrappers are the instructions they name.
  CHECK_FALSE(compile(with_e4m3(true), "sm_80", false).compiled);
}
