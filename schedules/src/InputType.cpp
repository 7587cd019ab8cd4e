#include "sage/schedules/InputType.h"

namespace sage::schedules {

std::string_view nameOf(InputType type) { return type == InputType::f16 ? "f16" : "bf16"; }

std::string_view nameOf(TensorLayout layout) { return layout == TensorLayout::hnd ? "hnd" : "nhd"; }

} // namespace sage::schedules
