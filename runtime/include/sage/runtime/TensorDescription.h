// A caller's tensor as the runtime sees it before trusting it: data pointer, shape, strides (in elements), element
// type and the device that holds it. AttentionCall.h validates a set of them against a kernel.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace sage::runtime {

enum class DataType { f16, bf16, f32, u8, boolean, i32 }; // i32: cu_seqlens (VarlenCall.h)
std::string_view nameOf(DataType type);                   // "f16", "bf16", "f32", "u8", "bool", "i32"
int64_t bytesOf(DataType type);

constexpr int kHostMemory = -1; // TensorDescription::device of host memory
constexpr int kMaxTensorRank = 4;

struct TensorDescription {
  const void *data = nullptr;
  int rank = 0;
  std::array<int64_t, kMaxTensorRank> shape{};
  std::array<int64_t, kMaxTensorRank> strides{}; // elements
  DataType dtype = DataType::f16;
  int device = kHostMemory; // CUDA device ordinal
};

} // namespace sage::runtime
