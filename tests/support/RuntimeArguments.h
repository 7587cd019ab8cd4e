// The runtime's argument checks under test: a contiguous tensor at a fake address (never dereferenced), and the message
// of the ArgumentError a call throws, after checking that the error names the expected argument (a call that throws
// nothing fails the test).
#pragma once

#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/TensorDescription.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace sage::test {

// A contiguous tensor of `shape` (rank 1 to 4) at address `at` on device 0.
inline runtime::TensorDescription contiguous(std::initializer_list<int64_t> shape, uintptr_t at,
                                             runtime::DataType dtype = runtime::DataType::f16) {
  runtime::TensorDescription tensor;
  tensor.data = reinterpret_cast<const void *>(at);
  tensor.rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = tensor.rank - 1; i >= 0; --i) {
    tensor.shape[static_cast<size_t>(i)] = shape.begin()[i];
    tensor.strides[static_cast<size_t>(i)] = stride;
    stride *= shape.begin()[i];
  }
  tensor.dtype = dtype;
  tensor.device = 0;
  return tensor;
}

inline std::string rejection(const std::function<void()> &body, const std::string &argument) {
  try {
    body();
  } catch (const runtime::ArgumentError &error) {
    CHECK(error.argument() == argument);
    return error.what();
  }
  FAIL("accepted; expected an error naming " << argument);
  return "";
}

inline bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

} // namespace sage::test
