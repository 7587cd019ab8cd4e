// The generated kernel's helpers: the PTX wrappers it uses, and the #include of the device library's tile helpers
// (sage/device/sm80/tile_helpers.cuh: shared-memory tile addressing and copies, lane reductions, scale groups and the
// map from S's columns to KV tokens).
#include "KernelText.h"

#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;
using schedules::ValueSource;

} // namespace

std::string emitInstructionWrappers(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  std::string text = "// ---- PTX instruction wrappers ----\n";
  text += emitMmaFunction(plan.qk_mma);
  if (!(plan.pv_mma == plan.qk_mma))
    text += emitMmaFunction(plan.pv_mma);
  text += emitLdmatrixFunction(4, false);
  if (plan.v_source != ValueSource::workspace_codes)
    text += emitLdmatrixFunction(4, true);
  else if (!context.fp4) // V^T's last k step when b_kv / 32 is odd (FP4: the decoded V^T has an even number of steps)
    text += emitLdmatrixFunction(2, false);
  text += emitCpAsyncCopy16Function();
  if (context.staged_k_scales)
    text += emitCpAsyncCopy4Function();
  text += emitCpAsyncCommitFunction();
  text += emitCpAsyncWaitFunction();
  text += emitExp2Function();
  if (context.variant.epilogue.write_lse)
    text += emitLog2Function();
  text += emitPackF16x2Function(); // P~ in f16, O in f16, the rescale factor of an f16 accumulator
  if (plan.input == schedules::InputType::bf16 || plan.pv_mma.a == ElementType::bf16) // output; or MXFP4's decode
    text += emitPackBf16x2Function();
  if (plan.pv_path == PvPath::f16_accumulate_f16) {
    text += emitScaleF16x2Function();
    text += emitUnpackF16x2Function();
  }
  if (plan.pv_path == PvPath::int8_per_block)
    text += emitPackS8x4Function();
  if (plan.pv_path == PvPath::e4m3_accumulate_f32)
    text += emitPackE4m3x4Function();
  return text + "\n";
}

std::string emitTileHelpers(const KernelContext &context) {
  return fmt::format(R"(// The CTA's dynamic shared memory: Q_i, then the pipeline stages (offsets above)
extern __shared__ __align__(128) unsigned char shared_memory[];

// ---- Tile helpers: swizzled tiles, cp.async copies, quad reductions, scale groups, S's columns ----
#include "sage/device/sm80/tile_helpers.cuh"
using ScoreColumns = sage::device::sm80::ScoreColumns<{}>; // {}
using sage::device::sm80::copy_tile_async;
using sage::device::sm80::Masked;
using sage::device::sm80::negative_infinity;
using sage::device::sm80::quad_max;
using sage::device::sm80::quad_sum;
using sage::device::sm80::scale_group;
using sage::device::sm80::swizzled_offset;
using sage::device::sm80::tile_address;

)",
                     context.plan.interleave_kv_tokens,
                     context.plan.interleave_kv_tokens ? "8-bit P.V: S's columns interleaved (kv_token_of_column)"
                                                       : "S's columns are the block's KV tokens in order");
}

} // namespace sage::codegen::detail
