// The CUDA driver API, loaded with dlopen at first use: the library links and runs on machines without a
// driver (CI), and says why the driver is unavailable instead of failing to start. Only the entry points the
// runtime needs are resolved, and their types are declared here, so public headers need no CUDA toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

// The driver's opaque handles, declared as cuda.h declares them, so a caller's CUstream or cudaStream_t
// converts to driver::Stream without a cast.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;

namespace sage::runtime {

namespace driver {

using Result = int; // CUresult
using Device = int; // CUdevice
using Context = CUctx_st *;
using Module = CUmod_st *;
using Function = CUfunc_st *;
using Stream = CUstream_st *;
using Event = CUevent_st *;
using DevicePointer = unsigned long long; // CUdeviceptr

// Values of CUdevice_attribute (checked against cuda.h at build time where it exists).
enum class DeviceAttribute : int {
  multiprocessor_count = 16,
  compute_capability_major = 75,
  compute_capability_minor = 76,
  max_shared_memory_per_block_optin = 97,
};

// Values of CUfunction_attribute (checked against cuda.h at build time where it exists).
enum class FunctionAttribute : int {
  max_threads_per_block = 0,
  shared_size_bytes = 1, // static shared memory
  const_size_bytes = 2,
  local_size_bytes = 3, // per-thread local memory (stack frame, spills)
  num_registers = 4,
  max_dynamic_shared_size_bytes = 8,
};

// CUtensorMap: 128 opaque bytes, 64-byte aligned (the layout of KernelAbi.h's SageTensorMap).
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// Values of CUtensorMapSwizzle (checked against cuda.h at build time where it exists).
enum class TensorMapSwizzle : int { none = 0, bytes32 = 1, bytes64 = 2, bytes128 = 3 };

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

} // namespace driver

struct DriverStatus {
  bool available = false;
  std::string reason;     // why the driver cannot be used, when it cannot
  int driver_version = 0; // CUDA version the driver supports, e.g. 13000
  int device_count = 0;
};

struct ComputeCapability {
  int major = 0, minor = 0;
};

class CudaDriver {
public:
  // The process-wide driver, loaded from libcuda.so.1 on the first call. Never unloaded: modules held by
  // static objects may still be unloaded through it at exit.
  static const CudaDriver &instance();

  // Loads the driver from `library` (tests use a missing name to exercise the unavailable path).
  explicit CudaDriver(const std::string &library);
  ~CudaDriver();
  CudaDriver(const CudaDriver &) = delete;
  CudaDriver &operator=(const CudaDriver &) = delete;

  // Whether a driver and at least one device are present; status().reason says why not.
  bool available() const { return status_.available; }
  const DriverStatus &status() const { return status_; }

  // Every call below throws CudaError naming the entry point and the driver's error string; where the driver
  // is unavailable they throw CudaError with status().reason.
  driver::Device device(int ordinal) const;
  int deviceAttribute(driver::DeviceAttribute attribute, driver::Device device) const;
  std::string deviceName(driver::Device device) const;
  ComputeCapability computeCapability(driver::Device device) const;

  driver::Context currentContext() const;
  driver::Device currentDevice() const;
  // Makes a context current on the calling thread and returns it: the current one if there is one, otherwise
  // device 0's primary context (retained once per process, the context the CUDA runtime API also uses).
  driver::Context ensureContext() const;
  // Device `ordinal`'s primary context (retained once per process and device), without making it current.
  // Throws CudaError naming the ordinal and the device count when there is no such device.
  driver::Context primaryContext(int ordinal) const;
  // Makes `context` current on the calling thread.
  void setCurrentContext(driver::Context context) const;
  void synchronizeContext() const;
  void synchronizeStream(driver::Stream stream) const;

  driver::Module loadModule(const void *image) const;
  // Unloads `module` with `context` (the one it was loaded into) current, restoring the caller's context after.
  // Returns the driver's result instead of throwing: for destructors.
  driver::Result unloadModule(driver::Module module, driver::Context context) const noexcept;
  driver::Function moduleFunction(driver::Module module, const char *name) const;
  void setFunctionAttribute(driver::Function function, driver::FunctionAttribute attribute, int value) const;
  int functionAttribute(driver::Function function, driver::FunctionAttribute attribute) const;
  void launchKernel(driver::Function function, driver::Dim3 grid, driver::Dim3 block, unsigned dynamic_shared_bytes,
                    driver::Stream stream, void **arguments) const;

  // Events time work on a stream (cuEventElapsedTime's resolution is about half a microsecond).
  driver::Event createEvent() const;
  driver::Result destroyEvent(driver::Event event) const noexcept;
  void recordEvent(driver::Event event, driver::Stream stream) const;
  void synchronizeEvent(driver::Event event) const;
  float elapsedMilliseconds(driver::Event start, driver::Event end) const;

  driver::DevicePointer allocate(std::size_t bytes) const;
  driver::Result free(driver::DevicePointer pointer) const noexcept;
  void copyToDevice(driver::DevicePointer destination, const void *source, std::size_t bytes) const;
  void copyToHost(void *destination, driver::DevicePointer source, std::size_t bytes) const;
  void fillBytes(driver::DevicePointer destination, unsigned char value, std::size_t bytes) const;
  // 32-bit words set on `stream` (4-byte aligned `destination`); capturable in a CUDA graph.
  void fillWordsAsync(driver::DevicePointer destination, unsigned value, std::size_t words,
                      driver::Stream stream) const;

  // cuTensorMapEncodeTiled for a tensor of bytes: `rank` dims (innermost first), `strides` of dims 1.. in bytes
  // (multiples of 16), boxes of `box` elements, zero fill out of bounds, L2 promotion of 256 bytes.
  void encodeTensorMap(driver::TensorMap &map, unsigned rank, const void *address, const std::uint64_t *dims,
                       const std::uint64_t *strides, const unsigned *box, driver::TensorMapSwizzle swizzle) const;

  // "CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid", or the number when the driver has no name.
  std::string errorText(driver::Result result) const;

  struct EntryPoints; // the resolved C entry points, defined in CudaDriver.cpp

private:
  const EntryPoints &entryPoints(const char *call) const;
  void check(driver::Result result, const char *call) const;

  std::unique_ptr<EntryPoints> entry_points_; // null when the library or one of its symbols is missing
  DriverStatus status_;
  mutable std::once_flag primary_context_once_;
  mutable driver::Context primary_context_ = nullptr;
  mutable std::mutex primary_contexts_mutex_;
  mutable std::map<int, driver::Context> primary_contexts_;
};

// Makes a context current for a scope and restores the caller's when it ends (also on an exception).
class ScopedContext {
public:
  ScopedContext(const CudaDriver &driver, driver::Context context);
  ~ScopedContext();
  ScopedContext(const ScopedContext &) = delete;
  ScopedContext &operator=(const ScopedContext &) = delete;

private:
  const CudaDriver *driver_;
  driver::Context previous_ = nullptr;
  bool switched_ = false;
};

} // namespace sage::runtime
