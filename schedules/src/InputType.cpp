#include "sage/schedules/InputType.h"

namespace sage::schedules {

std::string_view nameOf(InputType type) { return type == InputType::f16 ? "f16" : "bf16"; }

std::optional<InputType> parseInputType(std::string_view text) {
  if (text == "f16")
    return InputType::f16;
  if (text == "bf16")
    return InputType::bf16;
  return std::nullopt;
}

std::string_view nameOf(TensorLayout layout) { return layout == TensorLayout::hnd ? "hnd" : "nhd"; }

} // namespace sage::schedules
