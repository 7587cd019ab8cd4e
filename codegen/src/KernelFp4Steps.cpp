// FP4 by emulation (PvPath::e2m1_decoded, the legalized program on a target without the block-scaled mma): the
// decode of staged e2m1 codes x microscales into 16-bit tiles in shared memory, P~'s microscaling in registers
// (reference::quantizeProbabilities' f32 steps) and the P.V product over the decoded V_j^T. The device code is the
// device library's sage/device/sm80/fp4_steps.cuh (on sage/device/fp4/microscaling.cuh, host-tested against
// sage::numerics); this file emits its constants, its #include and its template arguments.
#include "KernelText.h"

#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sage::codegen::detail {

std::string emitFp4DecodeSteps(const KernelContext &context) {
  const bool bf16 = context.plan.qk_mma.a == ElementType::bf16;
  if (!(context.plan.pv_mma.a == context.plan.qk_mma.a))
    throw std::logic_error("FP4 emulation: Q.K^T and P.V decode to the same 16-bit type");
  return fmt::format("// ---- FP4 emulation: decoded to {}; the decode, P~'s microscales and the P.V product ----\n"
                     "#include \"sage/device/sm80/fp4_steps.cuh\"\n"
                     "using Fp4Steps = sage::device::sm80::Fp4Steps<{}, {}>;\n\n",
                     bf16 ? "bf16 (MXFP4)" : "f16 (NVFP4)", bf16 ? "pack_bf16x2" : "pack_f16x2",
                     mmaFunctionName(context.plan.pv_mma));
}

std::string emitFp4ValueSteps(const KernelContext &context) {
  return fmt::format("// ---- Steps of O_i^j += {}P^_i^j V^_j: P~ microscaled ({}) in Fp4Steps ----\n"
                     "using ValueSteps = Fp4Steps;\n\n",
                     context.plan.fp4_two_level_p ? "s_P1 " : "",
                     context.plan.fp4_two_level_p ? "two-level: s_P1 = rowmax(P~) / 2688 per row first" : "direct");
}

std::string fp4Constants(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const schedules::SharedMemoryLayout &shared = plan.shared;
  return fmt::format(
      R"(// ---- FP4 emulation: staged codes and scales, decoded tiles (bytes) ----
constexpr int kFp4Group = {group}; // elements per microscale ({format})
constexpr bool kTwoLevelP = {two_level}; // P: s_P1 = rowmax(P~) / 2688 per row before the microscales
constexpr int kQCodeRowBytes = {q_code_row}; // e2m1 codes, two per byte
constexpr int kKCodeRowBytes = {k_code_row};
constexpr int kVCodeRowBytes = {v_code_row}; // V_j^T: one row per channel
constexpr int kQScaleRowBytes = {q_scale_row};
constexpr int kKScaleRowBytes = {k_scale_row};
constexpr int kQCodesOffset = {q_codes}; // Q_i's codes and scales share the decoded tiles' bytes until Q_i is decoded
constexpr int kQScalesOffset = {q_scales};
constexpr int kKDecodedOffset = {k_decoded}; // K_j decoded [b_kv, d]
constexpr int kVDecodedOffset = {v_decoded}; // V_j^T decoded [d, b_kv]
constexpr int kKCodesOffset = {k_codes}; // within a stage
constexpr int kKScalesOffset = {k_scales}; // within a stage
constexpr int kVCodesOffset = {v_codes}; // within a stage
)",
      fmt::arg("group", plan.fp4_scale_group),
      fmt::arg("format", plan.fp4_scale_group == 32 ? "MXFP4, ue8m0" : "NVFP4, ue4m3"),
      fmt::arg("two_level", plan.fp4_two_level_p), fmt::arg("q_code_row", shared.q_codes.row_bytes),
      fmt::arg("k_code_row", shared.k.row_bytes), fmt::arg("v_code_row", shared.v.row_bytes),
      fmt::arg("q_scale_row", shared.q_scales.row_bytes), fmt::arg("k_scale_row", shared.k_scales.row_bytes),
      fmt::arg("q_codes", shared.q_codes.offset), fmt::arg("q_scales", shared.q_scales.offset),
      fmt::arg("k_decoded", shared.decoded_k.offset), fmt::arg("v_decoded", shared.decoded_v.offset),
      fmt::arg("k_codes", shared.k.offset), fmt::arg("k_scales", shared.k_scales.offset),
      fmt::arg("v_codes", shared.v.offset));
}

} // namespace sage::codegen::detail
