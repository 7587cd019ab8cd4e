// Loads libcuda with dlopen and wraps the entry points the runtime uses; every failure becomes a CudaError
// naming the call and carrying the driver's error string.
#include "sage/runtime/CudaDriver.h"

#include "sage/runtime/CudaError.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <type_traits>

// Where the toolkit is present, check that our copies of the driver's enum values and types match its own.
#if __has_include(<cuda.h>)
#include <cuda.h>
static_assert(sizeof(CUdeviceptr) == sizeof(sage::runtime::driver::DevicePointer));
static_assert(sizeof(CUdevice) == sizeof(sage::runtime::driver::Device));
static_assert(sizeof(CUresult) == sizeof(sage::runtime::driver::Result));
static_assert(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ==
              int(sage::runtime::driver::DeviceAttribute::multiprocessor_count));
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ==
              int(sage::runtime::driver::DeviceAttribute::compute_capability_major));
static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ==
              int(sage::runtime::driver::DeviceAttribute::compute_capability_minor));
static_assert(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN ==
              int(sage::runtime::driver::DeviceAttribute::max_shared_memory_per_block_optin));
static_assert(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ==
              int(sage::runtime::driver::FunctionAttribute::max_threads_per_block));
static_assert(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES == int(sage::runtime::driver::FunctionAttribute::shared_size_bytes));
static_assert(CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES == int(sage::runtime::driver::FunctionAttribute::const_size_bytes));
static_assert(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES == int(sage::runtime::driver::FunctionAttribute::local_size_bytes));
static_assert(CU_FUNC_ATTRIBUTE_NUM_REGS == int(sage::runtime::driver::FunctionAttribute::num_registers));
static_assert(sizeof(CUtensorMap) == sizeof(sage::runtime::driver::TensorMap));
static_assert(CU_TENSOR_MAP_DATA_TYPE_UINT8 == 0 && CU_TENSOR_MAP_INTERLEAVE_NONE == 0 &&
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE == 0 && CU_TENSOR_MAP_L2_PROMOTION_L2_256B == 3);
static_assert(CU_TENSOR_MAP_SWIZZLE_32B == int(sage::runtime::driver::TensorMapSwizzle::bytes32) &&
              CU_TENSOR_MAP_SWIZZLE_64B == int(sage::runtime::driver::TensorMapSwizzle::bytes64) &&
              CU_TENSOR_MAP_SWIZZLE_128B == int(sage::runtime::driver::TensorMapSwizzle::bytes128));
static_assert(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES ==
              int(sage::runtime::driver::FunctionAttribute::max_dynamic_shared_size_bytes));
#endif

namespace sage::runtime {

using namespace driver;

// The driver's C entry points. The names in `kSymbols` are the ABI names: cuda.h maps cuMemAlloc and friends
// to their `_v2` symbols with macros, so those are the ones to resolve.
struct CudaDriver::EntryPoints {
  Result (*init)(unsigned flags) = nullptr;
  Result (*driver_get_version)(int *version) = nullptr;
  Result (*get_error_name)(Result result, const char **name) = nullptr;
  Result (*get_error_string)(Result result, const char **text) = nullptr;
  Result (*device_get_count)(int *count) = nullptr;
  Result (*device_get)(Device *device, int ordinal) = nullptr;
  Result (*device_get_attribute)(int *value, int attribute, Device device) = nullptr;
  Result (*device_get_name)(char *name, int length, Device device) = nullptr;
  Result (*primary_context_retain)(Context *context, Device device) = nullptr;
  Result (*context_get_current)(Context *context) = nullptr;
  Result (*context_set_current)(Context context) = nullptr;
  Result (*context_get_device)(Device *device) = nullptr;
  Result (*context_synchronize)() = nullptr;
  Result (*stream_synchronize)(Stream stream) = nullptr;
  Result (*module_load_data)(Module *module, const void *image) = nullptr;
  Result (*module_unload)(Module module) = nullptr;
  Result (*module_get_function)(Function *function, Module module, const char *name) = nullptr;
  Result (*function_set_attribute)(Function function, int attribute, int value) = nullptr;
  Result (*function_get_attribute)(int *value, int attribute, Function function) = nullptr;
  Result (*launch_kernel)(Function function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                          unsigned block_y, unsigned block_z, unsigned shared_bytes, Stream stream, void **parameters,
                          void **extra) = nullptr;
  Result (*event_create)(Event *event, unsigned flags) = nullptr;
  Result (*event_destroy)(Event event) = nullptr;
  Result (*event_record)(Event event, Stream stream) = nullptr;
  Result (*event_synchronize)(Event event) = nullptr;
  Result (*event_elapsed_time)(float *milliseconds, Event start, Event end) = nullptr;
  Result (*memory_allocate)(DevicePointer *pointer, std::size_t bytes) = nullptr;
  Result (*memory_free)(DevicePointer pointer) = nullptr;
  Result (*copy_host_to_device)(DevicePointer destination, const void *source, std::size_t bytes) = nullptr;
  Result (*copy_device_to_host)(void *destination, DevicePointer source, std::size_t bytes) = nullptr;
  Result (*fill_bytes)(DevicePointer destination, unsigned char value, std::size_t bytes) = nullptr;
  Result (*fill_words_async)(DevicePointer destination, unsigned value, std::size_t words, Stream stream) = nullptr;
  Result (*tensor_map_encode_tiled)(void *map, int data_type, unsigned rank, void *address, const std::uint64_t *dims,
                                    const std::uint64_t *strides, const unsigned *box, const unsigned *element_strides,
                                    int interleave, int swizzle, int l2_promotion, int oob_fill) = nullptr;
};

namespace {

// Resolves every entry point; returns the first symbol the library lacks, or null.
const char *resolveEntryPoints(void *library, CudaDriver::EntryPoints &points) {
  const char *missing = nullptr;
  auto bind = [&](const char *symbol, auto &slot) {
    if (missing != nullptr)
      return;
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(dlsym(library, symbol));
    if (slot == nullptr)
      missing = symbol;
  };
  bind("cuInit", points.init);
  bind("cuDriverGetVersion", points.driver_get_version);
  bind("cuGetErrorName", points.get_error_name);
  bind("cuGetErrorString", points.get_error_string);
  bind("cuDeviceGetCount", points.device_get_count);
  bind("cuDeviceGet", points.device_get);
  bind("cuDeviceGetAttribute", points.device_get_attribute);
  bind("cuDeviceGetName", points.device_get_name);
  bind("cuDevicePrimaryCtxRetain", points.primary_context_retain);
  bind("cuCtxGetCurrent", points.context_get_current);
  bind("cuCtxSetCurrent", points.context_set_current);
  bind("cuCtxGetDevice", points.context_get_device);
  bind("cuCtxSynchronize", points.context_synchronize);
  bind("cuStreamSynchronize", points.stream_synchronize);
  bind("cuModuleLoadData", points.module_load_data);
  bind("cuModuleUnload", points.module_unload);
  bind("cuModuleGetFunction", points.module_get_function);
  bind("cuFuncSetAttribute", points.function_set_attribute);
  bind("cuFuncGetAttribute", points.function_get_attribute);
  bind("cuLaunchKernel", points.launch_kernel);
  bind("cuEventCreate", points.event_create);
  bind("cuEventDestroy_v2", points.event_destroy);
  bind("cuEventRecord", points.event_record);
  bind("cuEventSynchronize", points.event_synchronize);
  // cuda.h maps cuEventElapsedTime to _v2 from CUDA 12.8; older drivers only have the first version (same type).
  points.event_elapsed_time = reinterpret_cast<decltype(points.event_elapsed_time)>(
      dlsym(library, "cuEventElapsedTime_v2") ? dlsym(library, "cuEventElapsedTime_v2")
                                              : dlsym(library, "cuEventElapsedTime"));
  if (points.event_elapsed_time == nullptr && missing == nullptr)
    missing = "cuEventElapsedTime";
  bind("cuMemAlloc_v2", points.memory_allocate);
  bind("cuMemFree_v2", points.memory_free);
  bind("cuMemcpyHtoD_v2", points.copy_host_to_device);
  bind("cuMemcpyDtoH_v2", points.copy_device_to_host);
  bind("cuMemsetD8_v2", points.fill_bytes);
  bind("cuMemsetD32Async", points.fill_words_async);
  bind("cuTensorMapEncodeTiled", points.tensor_map_encode_tiled);
  return missing;
}

} // namespace

const CudaDriver &CudaDriver::instance() {
  // Deliberately leaked: objects destroyed at exit may still call into it.
  static const CudaDriver *driver = new CudaDriver("libcuda.so.1");
  return *driver;
}

CudaDriver::CudaDriver(const std::string &library) {
  // Never dlclose'd: libcuda does not support being unloaded while contexts exist.
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char *reason = dlerror();
    status_.reason = fmt::format("cannot load the CUDA driver: {}", reason ? reason : library);
    return;
  }
  auto points = std::make_unique<EntryPoints>();
  if (const char *missing = resolveEntryPoints(handle, *points)) {
    status_.reason =
        fmt::format("the CUDA driver library {} has no entry point {} (driver too old?)", library, missing);
    return;
  }
  entry_points_ = std::move(points);
  entry_points_->driver_get_version(&status_.driver_version);
  if (Result result = entry_points_->init(0)) {
    status_.reason = fmt::format("cuInit failed: {}", errorText(result));
    return;
  }
  if (Result result = entry_points_->device_get_count(&status_.device_count)) {
    status_.reason = fmt::format("cuDeviceGetCount failed: {}", errorText(result));
    return;
  }
  if (status_.device_count == 0) {
    status_.reason = "the CUDA driver found no device";
    return;
  }
  status_.available = true;
}

CudaDriver::~CudaDriver() = default;

std::string CudaDriver::errorText(Result result) const {
  const char *name = nullptr;
  const char *text = nullptr;
  if (entry_points_) {
    entry_points_->get_error_name(result, &name);
    entry_points_->get_error_string(result, &text);
  }
  if (name == nullptr)
    return fmt::format("CUDA error {}", result);
  return text ? fmt::format("{}: {}", name, text) : std::string(name);
}

const CudaDriver::EntryPoints &CudaDriver::entryPoints(const char *call) const {
  if (!status_.available)
    throw CudaError(call, 0, fmt::format("{}: the CUDA driver is unavailable: {}", call, status_.reason));
  return *entry_points_;
}

void CudaDriver::check(Result result, const char *call) const {
  if (result != 0)
    throw CudaError(call, result, fmt::format("{} failed: {}", call, errorText(result)));
}

Device CudaDriver::device(int ordinal) const {
  Device device = 0;
  check(entryPoints("cuDeviceGet").device_get(&device, ordinal), "cuDeviceGet");
  return device;
}

int CudaDriver::deviceAttribute(DeviceAttribute attribute, Device device) const {
  int value = 0;
  check(entryPoints("cuDeviceGetAttribute").device_get_attribute(&value, int(attribute), device),
        "cuDeviceGetAttribute");
  return value;
}

std::string CudaDriver::deviceName(Device device) const {
  std::array<char, 256> name{};
  check(entryPoints("cuDeviceGetName").device_get_name(name.data(), int(name.size()), device), "cuDeviceGetName");
  return name.data();
}

ComputeCapability CudaDriver::computeCapability(Device device) const {
  return {deviceAttribute(DeviceAttribute::compute_capability_major, device),
          deviceAttribute(DeviceAttribute::compute_capability_minor, device)};
}

Context CudaDriver::currentContext() const {
  Context context = nullptr;
  check(entryPoints("cuCtxGetCurrent").context_get_current(&context), "cuCtxGetCurrent");
  return context;
}

Device CudaDriver::currentDevice() const {
  Device device = 0;
  check(entryPoints("cuCtxGetDevice").context_get_device(&device), "cuCtxGetDevice");
  return device;
}

Context CudaDriver::ensureContext() const {
  if (Context current = currentContext())
    return current;
  std::call_once(primary_context_once_, [this] {
    Context primary = nullptr;
    check(entryPoints("cuDevicePrimaryCtxRetain").primary_context_retain(&primary, device(0)),
          "cuDevicePrimaryCtxRetain");
    primary_context_ = primary;
  });
  check(entryPoints("cuCtxSetCurrent").context_set_current(primary_context_), "cuCtxSetCurrent");
  return primary_context_;
}

Context CudaDriver::primaryContext(int ordinal) const {
  if (ordinal < 0 || ordinal >= status_.device_count)
    throw CudaError("cuDeviceGet", 0,
                    fmt::format("device {}: expected a CUDA device ordinal from 0 to {} ({} devices{})", ordinal,
                                status_.device_count - 1, status_.device_count,
                                available() ? "" : "; " + status_.reason));
  std::lock_guard lock(primary_contexts_mutex_);
  Context &context = primary_contexts_[ordinal];
  if (!context) {
    Context primary = nullptr;
    check(entryPoints("cuDevicePrimaryCtxRetain").primary_context_retain(&primary, device(ordinal)),
          "cuDevicePrimaryCtxRetain");
    context = primary;
  }
  return context;
}

void CudaDriver::setCurrentContext(Context context) const {
  check(entryPoints("cuCtxSetCurrent").context_set_current(context), "cuCtxSetCurrent");
}

ScopedContext::ScopedContext(const CudaDriver &driver, driver::Context context) : driver_(&driver) {
  previous_ = driver.currentContext();
  if (previous_ != context) {
    driver.setCurrentContext(context);
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (switched_) {
    try {
      driver_->setCurrentContext(previous_);
    } catch (...) { // a destructor must not throw; the driver is already failing
    }
  }
}

void CudaDriver::synchronizeContext() const {
  check(entryPoints("cuCtxSynchronize").context_synchronize(), "cuCtxSynchronize");
}

void CudaDriver::synchronizeStream(Stream stream) const {
  check(entryPoints("cuStreamSynchronize").stream_synchronize(stream), "cuStreamSynchronize");
}

Module CudaDriver::loadModule(const void *image) const {
  Module module = nullptr;
  check(entryPoints("cuModuleLoadData").module_load_data(&module, image), "cuModuleLoadData");
  return module;
}

Result CudaDriver::unloadModule(Module module, Context context) const noexcept {
  if (!entry_points_)
    return 0;
  Context previous = nullptr;
  entry_points_->context_get_current(&previous);
  bool switch_context = context != nullptr && context != previous;
  if (switch_context)
    entry_points_->context_set_current(context);
  Result result = entry_points_->module_unload(module);
  if (switch_context)
    entry_points_->context_set_current(previous);
  return result;
}

Function CudaDriver::moduleFunction(Module module, const char *name) const {
  Function function = nullptr;
  Result result = entryPoints("cuModuleGetFunction").module_get_function(&function, module, name);
  if (result != 0)
    throw CudaError("cuModuleGetFunction", result,
                    fmt::format("cuModuleGetFunction failed for kernel '{}': {}", name, errorText(result)));
  return function;
}

void CudaDriver::setFunctionAttribute(Function function, FunctionAttribute attribute, int value) const {
  check(entryPoints("cuFuncSetAttribute").function_set_attribute(function, int(attribute), value),
        "cuFuncSetAttribute");
}

int CudaDriver::functionAttribute(Function function, FunctionAttribute attribute) const {
  int value = 0;
  check(entryPoints("cuFuncGetAttribute").function_get_attribute(&value, int(attribute), function),
        "cuFuncGetAttribute");
  return value;
}

void CudaDriver::launchKernel(Function function, Dim3 grid, Dim3 block, unsigned dynamic_shared_bytes, Stream stream,
                              void **arguments) const {
  check(entryPoints("cuLaunchKernel")
            .launch_kernel(function, grid.x, grid.y, grid.z, block.x, block.y, block.z, dynamic_shared_bytes, stream,
                           arguments, nullptr),
        "cuLaunchKernel");
}

Event CudaDriver::createEvent() const {
  Event event = nullptr;
  check(entryPoints("cuEventCreate").event_create(&event, 0), "cuEventCreate"); // 0: CU_EVENT_DEFAULT, timed
  return event;
}

Result CudaDriver::destroyEvent(Event event) const noexcept {
  return entry_points_ && event ? entry_points_->event_destroy(event) : 0;
}

void CudaDriver::recordEvent(Event event, Stream stream) const {
  check(entryPoints("cuEventRecord").event_record(event, stream), "cuEventRecord");
}

void CudaDriver::synchronizeEvent(Event event) const {
  check(entryPoints("cuEventSynchronize").event_synchronize(event), "cuEventSynchronize");
}

float CudaDriver::elapsedMilliseconds(Event start, Event end) const {
  float milliseconds = 0.0f;
  check(entryPoints("cuEventElapsedTime").event_elapsed_time(&milliseconds, start, end), "cuEventElapsedTime");
  return milliseconds;
}

DevicePointer CudaDriver::allocate(std::size_t bytes) const {
  DevicePointer pointer = 0;
  check(entryPoints("cuMemAlloc").memory_allocate(&pointer, bytes), "cuMemAlloc");
  return pointer;
}

Result CudaDriver::free(DevicePointer pointer) const noexcept {
  return entry_points_ ? entry_points_->memory_free(pointer) : 0;
}

void CudaDriver::copyToDevice(DevicePointer destination, const void *source, std::size_t bytes) const {
  check(entryPoints("cuMemcpyHtoD").copy_host_to_device(destination, source, bytes), "cuMemcpyHtoD");
}

void CudaDriver::copyToHost(void *destination, DevicePointer source, std::size_t bytes) const {
  check(entryPoints("cuMemcpyDtoH").copy_device_to_host(destination, source, bytes), "cuMemcpyDtoH");
}

void CudaDriver::encodeTensorMap(TensorMap &map, unsigned rank, const void *address, const std::uint64_t *dims,
                                 const std::uint64_t *strides, const unsigned *box, TensorMapSwizzle swizzle) const {
  const std::array<unsigned, 5> element_strides{1, 1, 1, 1, 1};
  constexpr int kUint8 = 0, kNoInterleave = 0, kL2Promotion256 = 3, kNoOobFill = 0; // OOB elements read as zero
  check(entryPoints("cuTensorMapEncodeTiled")
            .tensor_map_encode_tiled(&map, kUint8, rank, const_cast<void *>(address), dims, strides, box,
                                     element_strides.data(), kNoInterleave, int(swizzle), kL2Promotion256, kNoOobFill),
        "cuTensorMapEncodeTiled");
}

void CudaDriver::fillBytes(DevicePointer destination, unsigned char value, std::size_t bytes) const {
  check(entryPoints("cuMemsetD8").fill_bytes(destination, value, bytes), "cuMemsetD8");
}

void CudaDriver::fillWordsAsync(DevicePointer destination, unsigned value, std::size_t words, Stream stream) const {
  check(entryPoints("cuMemsetD32Async").fill_words_async(destination, value, words, stream), "cuMemsetD32Async");
}

} // namespace sage::runtime
