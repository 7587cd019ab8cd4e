#include "sage/runtime/TensorDescription.h"

namespace sage::runtime {

std::string_view nameOf(DataType type) {
  switch (type) {
  case DataType::f16:
    return "f16";
  case DataType::bf16:
    return "bf16";
  case DataType::f32:
    return "f32";
  case DataType::u8:
    return "u8";
  case DataType::boolean:
    return "bool";
  case DataType::i32:
    return "i32";
  }
  return "unknown";
}

int64_t bytesOf(DataType type) {
  switch (type) {
  case DataType::f16:
  case DataType::bf16:
    return 2;
  case DataType::f32:
  case DataType::i32:
    return 4;
  case DataType::u8:
  case DataType::boolean:
    return 1;
  }
  return 0;
}

} // namespace sage::runtime
