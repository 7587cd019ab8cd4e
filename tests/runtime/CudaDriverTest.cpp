// The dlopen'ed driver: a missing library is reported, not fatal; with a GPU, basic queries and the context.
#include "sage/runtime/CudaDriver.h"

#include "sage/runtime/CudaError.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <string>

using namespace sage::runtime;

TEST_CASE("a missing driver library makes the driver unavailable, with the reason, and calls throw CudaError") {
  CudaDriver driver("libsagegen-no-such-driver.so.1");
  CHECK_FALSE(driver.available());
  CHECK(driver.status().reason.find("libsagegen-no-such-driver.so.1") != std::string::npos);
  try {
    driver.loadModule("not an image");
    FAIL("expected a CudaError");
  } catch (const CudaError &error) {
    CHECK(error.call() == "cuModuleLoadData");
    CHECK(std::string(error.what()).find("unavailable") != std::string::npos);
    CHECK(std::string(error.what()).find(driver.status().reason) != std::string::npos);
  }
  CHECK_THROWS_AS(driver.ensureContext(), CudaError);
  CHECK(driver.errorText(1) == "CUDA error 1");
}

TEST_CASE("the process-wide driver: unavailable with a reason, or a device to query") {
  const CudaDriver &driver = CudaDriver::instance();
  CHECK(&driver == &CudaDriver::instance());
  if (!driver.available()) {
    std::printf("runtime_cuda_driver_test: no usable CUDA driver (%s); checking the unavailable path only\n",
                driver.status().reason.c_str());
    CHECK(!driver.status().reason.empty());
    CHECK_THROWS_AS(driver.device(0), CudaError);
    return;
  }
  CHECK(driver.status().reason.empty());
  CHECK(driver.status().device_count >= 1);
  CHECK(driver.status().driver_version >= 12000);
  driver::Device device = driver.device(0);
  ComputeCapability capability = driver.computeCapability(device);
  CHECK(capability.major >= 7);
  CHECK(!driver.deviceName(device).empty());
  CHECK(driver.deviceAttribute(driver::DeviceAttribute::multiprocessor_count, device) > 0);
  CHECK(driver.deviceAttribute(driver::DeviceAttribute::max_shared_memory_per_block_optin, device) >= 48 * 1024);
  std::printf("runtime_cuda_driver_test: %s, sm_%d%d, driver %d\n", driver.deviceName(device).c_str(), capability.major,
              capability.minor, driver.status().driver_version);

  driver::Context context = driver.ensureContext();
  CHECK(context != nullptr);
  CHECK(driver.currentContext() == context);
  CHECK(driver.ensureContext() == context);
  CHECK(driver.currentDevice() == device);

  // Driver errors name the call and carry the driver's error string.
  try {
    driver.loadModule("this is not a cubin");
    FAIL("expected a CudaError");
  } catch (const CudaError &error) {
    CHECK(error.call() == "cuModuleLoadData");
    CHECK(error.result() != 0);
    CHECK(std::string(error.what()).find("CUDA_ERROR_") != std::string::npos);
  }
}

TEST_CASE("events time the work between two records") {
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.available()) {
    CHECK_THROWS_AS(driver.createEvent(), CudaError);
    CHECK(driver.destroyEvent(nullptr) == 0);
    return;
  }
  driver.ensureContext();
  driver::Event start = driver.createEvent(), end = driver.createEvent();
  const size_t bytes = 64 << 20;
  driver::DevicePointer buffer = driver.allocate(bytes);
  driver.recordEvent(start, nullptr);
  driver.fillBytes(buffer, 0, bytes);
  driver.recordEvent(end, nullptr);
  driver.synchronizeEvent(end);
  const float milliseconds = driver.elapsedMilliseconds(start, end);
  CHECK(milliseconds > 0.0f);
  CHECK(milliseconds < 1000.0f);
  driver.free(buffer);
  CHECK(driver.destroyEvent(start) == 0);
  CHECK(driver.destroyEvent(end) == 0);
}
