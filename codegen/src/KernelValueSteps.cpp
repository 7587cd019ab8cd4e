// Steps of O_i^j += P~_i^j V_j: P~ from the S registers into the A fragment of the P.V mma, the mma itself over
// V_j in shared memory, and the flush of a two-level accumulator. The device code is the device library's
// (sage/device/sm80/value_steps_*.cuh, two_level.cuh); this file picks the header and its template arguments: the
// PTX wrappers the kernel emitted for the P.V mma and the 8-bit codes.
#include "KernelText.h"

#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;

constexpr std::string_view kTwoLevel = R"(// ---- Two-level accumulation: the flush of the P.V accumulator ----
#include "sage/device/sm80/two_level.cuh"
using sage::device::sm80::flush_accumulator;

)";

} // namespace

std::string emitValueSteps(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const std::string pv_mma = mmaFunctionName(plan.pv_mma);
  std::string text;
  switch (plan.pv_path) {
  case PvPath::f16_accumulate_f16:
  case PvPath::f16_accumulate_f32:
    text += fmt::format("// ---- Steps of O_i^j += P~_i^j V_j: f16 P~, the {} mma ----\n"
                        "#include \"sage/device/sm80/value_steps_f16.cuh\"\n"
                        "using ValueSteps = sage::device::sm80::F16ValueSteps<{}>;\n\n",
                        plan.pv_path == PvPath::f16_accumulate_f16 ? "f16-accumulating" : "f32-accumulating", pv_mma);
    if (context.two_level)
      text += kTwoLevel;
    break;
  case PvPath::int8_per_block:
    text += fmt::format("// ---- Steps of O_i^j += P~_i^j V_j: int8 P~ codes, the block's product in s32 ----\n"
                        "#include \"sage/device/sm80/value_steps_codes.cuh\"\n"
                        "using ValueSteps = sage::device::sm80::CodeValueSteps<sage::device::sm80::CodeProduct::"
                        "s32_per_block, pack_s8x4, {}>;\n\n",
                        pv_mma);
    break;
  case PvPath::e4m3_accumulate_f32:
    text += fmt::format("// ---- Steps of O_i^j += P~_i^j V_j: e4m3 P~ codes, accumulated in f32 ----\n"
                        "#include \"sage/device/sm80/value_steps_codes.cuh\"\n"
                        "using ValueSteps = sage::device::sm80::CodeValueSteps<sage::device::sm80::CodeProduct::f32, "
                        "pack_e4m3x4, {}>;\n\n",
                        pv_mma);
    if (context.two_level)
      text += kTwoLevel;
    break;
  case PvPath::e2m1_decoded:
    text += emitFp4ValueSteps(context);
    break;
  case PvPath::e2m1_block_scaled:
    throw std::invalid_argument("plan.pv_path: e2m1_block_scaled is the sm120 schedule's, not the sm80 writer's");
  }
  return text;
}

} // namespace sage::codegen::detail
