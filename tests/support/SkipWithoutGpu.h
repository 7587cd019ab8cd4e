// GPU test cases return early where no CUDA driver or device is present, and the test program says so once.
#pragma once

#include "sage/runtime/CudaDriver.h"

#include <cstdio>

namespace sage::test {

// True (after printing "<program>: SKIPPED, no GPU: <reason>" the first time) when there is no GPU.
inline bool skipWithoutGpu(const char *program) {
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  if (driver.available())
    return false;
  static bool reported = false;
  if (!reported)
    std::printf("%s: SKIPPED, no GPU: %s\n", program, driver.status().reason.c_str());
  reported = true;
  return true;
}

} // namespace sage::test
