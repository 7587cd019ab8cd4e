// A device allocation for the SLA GPU tests, filled with 0xff bytes (NaN patterns) so that what a kernel forgets to
// write shows up in the comparison with the CPU reference.
#pragma once

#include "sage/runtime/CudaDriver.h"

#include <cstddef>
#include <vector>

namespace sage::test {

struct NanFilledDeviceBuffer {
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  runtime::driver::DevicePointer pointer = 0;
  size_t bytes = 0;
  explicit NanFilledDeviceBuffer(size_t size) : bytes(size) {
    pointer = driver.allocate(bytes);
    driver.fillBytes(pointer, 0xff, bytes);
  }
  ~NanFilledDeviceBuffer() { driver.free(pointer); }
  NanFilledDeviceBuffer(const NanFilledDeviceBuffer &) = delete;
  NanFilledDeviceBuffer &operator=(const NanFilledDeviceBuffer &) = delete;
  void *get() const { return reinterpret_cast<void *>(pointer); }
  template <typename T> std::vector<T> read(size_t offset, size_t count) const {
    std::vector<T> values(count);
    driver.copyToHost(values.data(), pointer + offset, count * sizeof(T));
    return values;
  }
};

} // namespace sage::test
