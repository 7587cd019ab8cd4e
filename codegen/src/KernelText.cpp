#include "KernelText.h"

#include <fmt/format.h>

#include <stdexcept>

namespace sage::codegen::detail {

std::string substitute(std::string_view text, std::initializer_list<std::pair<std::string_view, std::string>> values) {
  std::string result;
  result.reserve(text.size());
  size_t position = 0;
  while (position < text.size()) {
    size_t open = text.find('@', position);
    if (open == std::string_view::npos) {
      result.append(text.substr(position));
      break;
    }
    size_t close = text.find('@', open + 1);
    if (close == std::string_view::npos)
      throw std::logic_error("kernel template: unmatched '@'");
    std::string_view key = text.substr(open + 1, close - open - 1);
    const std::string *value = nullptr;
    for (const auto &[name, replacement] : values)
      if (name == key)
        value = &replacement;
    if (!value)
      throw std::logic_error("kernel template: no value for @" + std::string(key) + "@");
    result.append(text.substr(position, open - position));
    result.append(*value);
    position = close + 1;
  }
  return result;
}

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

} // namespace sage::codegen::detail
