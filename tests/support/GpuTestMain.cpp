// main() of the GPU test programs: without a CUDA driver or device they print why and exit with
// kSkipReturnCode, which CTest (SKIP_RETURN_CODE, set by sagegen_add_gpu_test) reports as skipped, not passed.
#define DOCTEST_CONFIG_IMPLEMENT
#include "sage/runtime/CudaDriver.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>

namespace {
constexpr int kSkipReturnCode = 77;
}

int main(int argc, char **argv) {
  const sage::runtime::CudaDriver &driver = sage::runtime::CudaDriver::instance();
  if (!driver.available()) {
    std::printf("%s: SKIPPED, no GPU: %s\n", std::filesystem::path(argv[0]).filename().c_str(),
                driver.status().reason.c_str());
    return kSkipReturnCode;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
