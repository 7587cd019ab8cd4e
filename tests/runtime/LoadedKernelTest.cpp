// Loads and launches NVRTC-compiled kernels on the GPU; skipped, with a message, where no driver exists.
#include "sage/runtime/LoadedKernel.h"
#include "../support/SkipWithoutGpu.h"

#include "sage/runtime/CudaError.h"
#include "sage/runtime/ModuleRegistry.h"
#include "sage/runtime/NvrtcCompiler.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

using namespace sage::runtime;

namespace {

// Our kernels take one parameter struct by value; this one mirrors that shape.
struct FillParams {
  int *out;
  int count;
  int base;
  int step;
};

const char *kKernels = R"(
struct FillParams {
  int *out;
  int count;
  int base;
  int step;
};

extern "C" __global__ void fill(FillParams params) {
  int index = blockIdx.x * blockDim.x + threadIdx.x;
  if (index < params.count)
    params.out[index] = params.base + params.step * index;
}

// Writes through dynamic shared memory: each thread fills a slice, then reads a neighbour's slice.
extern "C" __global__ void through_shared(FillParams params) {
  extern __shared__ int staging[];
  int per_thread = params.count / blockDim.x;
  for (int i = 0; i < per_thread; ++i)
    staging[threadIdx.x * per_thread + i] = params.base + threadIdx.x * per_thread + i;
  __syncthreads();
  int neighbour = (threadIdx.x + 1) % blockDim.x;
  for (int i = 0; i < per_thread; ++i)
    params.out[neighbour * per_thread + i] = staging[neighbour * per_thread + i];
}
)";

bool skipWithoutDriver() { return sage::test::skipWithoutGpu("runtime_loaded_kernel_test"); }

std::string deviceArch() {
  const CudaDriver &driver = CudaDriver::instance();
  ComputeCapability capability = driver.computeCapability(driver.device(0));
  std::string arch = "sm_" + std::to_string(capability.major) + std::to_string(capability.minor);
  return capability.major >= 9 ? arch + "a" : arch;
}

CompileResult compileForDevice(bool ptx = false) {
  CompileRequest request;
  request.key = "loaded-kernel-test";
  request.source = kKernels;
  request.options.arch = deviceArch();
  return ptx ? NvrtcCompiler().compilePtx(request) : NvrtcCompiler().compileCubin(request);
}

// Device memory for `count` ints, freed on scope exit.
struct DeviceInts {
  const CudaDriver &driver = CudaDriver::instance();
  driver::DevicePointer pointer;
  int count;
  explicit DeviceInts(int count) : pointer(driver.allocate(sizeof(int) * count)), count(count) {
    driver.fillBytes(pointer, 0xff, sizeof(int) * count);
  }
  ~DeviceInts() { driver.free(pointer); }
  std::vector<int> read() const {
    std::vector<int> values(count);
    driver.copyToHost(values.data(), pointer, sizeof(int) * count);
    return values;
  }
  int *get() const { return reinterpret_cast<int *>(pointer); }
};

} // namespace

TEST_CASE("a cubin loads, and a kernel launched with a by-value parameter struct writes the expected values") {
  if (skipWithoutDriver())
    return;
  const CudaDriver &driver = CudaDriver::instance();
  CompileResult compiled = compileForDevice();
  std::shared_ptr<LoadedModule> module = LoadedModule::load(compiled.image);
  LoadedKernel fill = module->kernel("fill");
  CHECK(fill.name() == "fill");
  CHECK(fill.attribute(driver::FunctionAttribute::num_registers) > 0);

  DeviceInts output(1000);
  FillParams params{output.get(), 1000, 17, 3};
  fill.launch(params, {.grid = {4, 1, 1}, .block = {256, 1, 1}, .dynamic_shared_bytes = 0, .stream = nullptr});
  driver.synchronizeContext();
  std::vector<int> values = output.read();
  for (int index = 0; index < 1000; ++index)
    if (values[index] != 17 + 3 * index)
      FAIL("out[" << index << "] = " << values[index] << ", expected " << 17 + 3 * index);

  // Host cost of a launch: one driver call, no allocation. Reported, not asserted (machines differ). Few enough
  // launches that the driver's queue does not fill and make the host wait for the GPU.
  constexpr int kLaunches = 1000;
  auto start = std::chrono::steady_clock::now();
  for (int launch = 0; launch < kLaunches; ++launch)
    fill.launch(params, {.grid = {1, 1, 1}, .block = {32, 1, 1}, .dynamic_shared_bytes = 0, .stream = nullptr});
  double microseconds = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  driver.synchronizeContext();
  std::printf("runtime_loaded_kernel_test: %d launches, %.2f us of host time per launch\n", kLaunches,
              microseconds / kLaunches);
}

TEST_CASE("PTX text loads too (the driver JIT-compiles it)") {
  if (skipWithoutDriver())
    return;
  std::shared_ptr<LoadedModule> module = LoadedModule::load(compileForDevice(/*ptx=*/true).image);
  DeviceInts output(64);
  module->kernel("fill").launch(FillParams{output.get(), 64, -5, 2},
                                {.grid = {1, 1, 1}, .block = {64, 1, 1}, .dynamic_shared_bytes = 0, .stream = nullptr});
  CudaDriver::instance().synchronizeContext();
  std::vector<int> values = output.read();
  for (int index = 0; index < 64; ++index)
    CHECK(values[index] == -5 + 2 * index);
}

TEST_CASE("dynamic shared memory above 48 KiB after opting in; beyond the device limit is refused") {
  if (skipWithoutDriver())
    return;
  const CudaDriver &driver = CudaDriver::instance();
  LoadedKernel kernel = LoadedModule::load(compileForDevice().image)->kernel("through_shared");
  int limit = driver.deviceAttribute(driver::DeviceAttribute::max_shared_memory_per_block_optin, driver.device(0));
  constexpr int kThreads = 256;
  int count = (limit / int(sizeof(int))) / kThreads * kThreads; // as many ints as fit, a multiple of the threads
  unsigned shared_bytes = unsigned(count) * sizeof(int);
  REQUIRE(shared_bytes > 48 * 1024);

  CHECK_THROWS_WITH_AS(kernel.setMaxDynamicSharedMemory(limit + 1), doctest::Contains("at most"),
                       std::invalid_argument);
  kernel.setMaxDynamicSharedMemory(int(shared_bytes));
  CHECK(kernel.attribute(driver::FunctionAttribute::max_dynamic_shared_size_bytes) == int(shared_bytes));

  DeviceInts output(count);
  kernel.launch(
      FillParams{output.get(), count, 1000, 0},
      {.grid = {1, 1, 1}, .block = {kThreads, 1, 1}, .dynamic_shared_bytes = shared_bytes, .stream = nullptr});
  driver.synchronizeContext();
  std::vector<int> values = output.read();
  int wrong = 0;
  for (int index = 0; index < count; ++index)
    wrong += values[index] != 1000 + index;
  CHECK(wrong == 0);
}

TEST_CASE("launch and load errors become CudaError naming the call") {
  if (skipWithoutDriver())
    return;
  LoadedKernel fill = LoadedModule::load(compileForDevice().image)->kernel("fill");
  DeviceInts output(1);
  CHECK_THROWS_WITH_AS(fill.launch(FillParams{output.get(), 1, 0, 0}, {.grid = {1, 1, 1},
                                                                       .block = {4096, 1, 1}, // over 1024 threads
                                                                       .dynamic_shared_bytes = 0,
                                                                       .stream = nullptr}),
                       doctest::Contains("cuLaunchKernel"), CudaError);
  CHECK_THROWS_WITH_AS(LoadedModule::load(compileForDevice().image)->kernel("no_such_kernel"),
                       doctest::Contains("no_such_kernel"), CudaError);
  // Not ELF, so the driver reads it as (invalid) PTX text: it has no size argument, a fake ELF header could make
  // it read past the buffer.
  const std::string garbage = "this is not a module";
  CHECK_THROWS_WITH_AS(LoadedModule::load(bytesOf(garbage)), doctest::Contains("cuModuleLoadData"), CudaError);
  CHECK_THROWS_AS(LoadedModule::load(ByteSpan{}), std::invalid_argument);
}

TEST_CASE("the registry loads an image once per key and context") {
  if (skipWithoutDriver())
    return;
  ModuleRegistry registry;
  ByteBuffer image = compileForDevice().image;
  std::shared_ptr<const LoadedModule> first = registry.getOrLoad("key-a", image);
  std::shared_ptr<const LoadedModule> again = registry.getOrLoad("key-a", image);
  std::shared_ptr<const LoadedModule> other = registry.getOrLoad("key-b", image);
  CHECK(first == again);
  CHECK(first != other);
  CHECK(registry.size() == 2);
  CHECK(first->context() == CudaDriver::instance().currentContext());

  LoadedKernel kernel = first->kernel("fill");
  registry.clear();
  CHECK(registry.size() == 0);
  // The kernel keeps its module loaded after the registry forgot it.
  DeviceInts output(8);
  kernel.launch(FillParams{output.get(), 8, 1, 1},
                {.grid = {1, 1, 1}, .block = {8, 1, 1}, .dynamic_shared_bytes = 0, .stream = nullptr});
  CudaDriver::instance().synchronizeContext();
  CHECK(output.read()[7] == 8);
}
