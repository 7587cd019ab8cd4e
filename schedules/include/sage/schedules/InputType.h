// The storage type of the caller's Q, K, V and O tensors (not of the quantized codes).
#pragma once

#include <optional>
#include <string_view>

namespace sage::schedules {

enum class InputType { f16, bf16 };
enum class TensorLayout { hnd, nhd }; // [b, h, n, d] or [b, n, h, d]; other outer strides are launch arguments

std::string_view nameOf(InputType type);
std::string_view nameOf(TensorLayout layout);
std::optional<InputType> parseInputType(std::string_view text); // "f16" or "bf16"

} // namespace sage::schedules
