#include "KernelText.h"

#include <fmt/format.h>

namespace sage::codegen::detail {

std::string floatLiteral(double value) {
  std::string text = fmt::format("{}", static_cast<float>(value));
  if (text.find_first_of(".en") == std::string::npos) // "127" -> "127.0"; keeps "1e-05", "inf" untouched
    text += ".0";
  return text + "f";
}

KernelContext makeContext(const AttentionVariant &variant, const schedules::KernelPlan &plan, std::string name) {
  KernelContext context{variant, plan, std::move(name)};
  context.causal = variant.mask.kind == MaskKind::causal;
  context.block_sparse = variant.mask.kind == MaskKind::block_sparse;
  context.quantized_qk = plan.q_scales.used;
  context.staged_k_scales = plan.k_scales_per_block > 1;
  context.two_level = variant.accumulation.kind == AccumulationKind::f16_then_f32 ||
                      variant.accumulation.kind == AccumulationKind::f32_two_level;
  context.smoothed_v = variant.smooth_v != SmoothScope::none;
  context.smoothed_q = variant.smooth_q == SmoothScope::block;
  context.fp4 = plan.pv_path == schedules::PvPath::e2m1_decoded;
  context.lse_correction =
      variant.epilogue.write_lse && variant.epilogue.lse_smoothing_correction && variant.smooth_k != SmoothScope::none;
  return context;
}

KernelSource kernelSourceOf(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  KernelSource kernel;
  kernel.name = context.name;
  kernel.entry_point = context.name;
  kernel.block_dim = {plan.threads, 1, 1};
  kernel.grid = plan.grid;
  kernel.grid_description = plan.grid.description();
  kernel.dynamic_shared_bytes = plan.shared.total_bytes;
  kernel.arch = plan.arch;
  kernel.uses_device_library = true;
  return kernel;
}

std::string_view valueSourceName(schedules::ValueSource source) {
  using schedules::ValueSource;
  switch (source) {
  case ValueSource::input:
    return "input";
  case ValueSource::workspace_values:
    return "workspace_values";
  case ValueSource::workspace_codes:
    return "workspace_codes";
  }
  return "";
}

} // namespace sage::codegen::detail
