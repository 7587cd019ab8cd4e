// A cubin loaded into a CUDA context (LoadedModule) and one of its kernels (LoadedKernel), launched with a
// parameter block passed by value as the kernel's single argument (see codegen's KernelAbi.h). A launch is one
// driver call: no allocation, no lock.
#pragma once

#include "sage/runtime/Bytes.h"
#include "sage/runtime/CudaDriver.h"

#include <memory>
#include <string>
#include <type_traits>

namespace sage::runtime {

struct LaunchConfig {
  driver::Dim3 grid;
  driver::Dim3 block;
  unsigned dynamic_shared_bytes = 0;
  driver::Stream stream = nullptr; // a CUstream / cudaStream_t; null is the legacy default stream
};

class LoadedKernel;

class LoadedModule : public std::enable_shared_from_this<LoadedModule> {
public:
  // Loads a cubin (or PTX text) into the calling thread's current context, making device 0's primary context
  // current first if there is none. Throws CudaError when the driver is unavailable or rejects the image.
  static std::shared_ptr<LoadedModule> load(ByteSpan image, const CudaDriver &driver = CudaDriver::instance());
  ~LoadedModule();
  LoadedModule(const LoadedModule &) = delete;
  LoadedModule &operator=(const LoadedModule &) = delete;

  // A kernel of this module by its (lowered) name; the kernel keeps the module loaded.
  LoadedKernel kernel(const std::string &name) const;

  driver::Module handle() const { return module_; }
  driver::Context context() const { return context_; }
  driver::Device device() const { return device_; }

private:
  LoadedModule(const CudaDriver &driver, driver::Module module, driver::Context context, driver::Device device);

  const CudaDriver *driver_;
  driver::Module module_;
  driver::Context context_;
  driver::Device device_;
};

class LoadedKernel {
public:
  LoadedKernel() = default;

  const std::string &name() const { return name_; }
  driver::Function handle() const { return function_; }

  // Allows launches with up to `bytes` of dynamic shared memory (needed above 48 KiB). Throws
  // std::invalid_argument naming the device's opt-in limit when `bytes` exceeds it.
  void setMaxDynamicSharedMemory(int bytes) const;
  int attribute(driver::FunctionAttribute attribute) const;

  // Launches with `params` copied by value as the kernel's only argument. The module's context must be current
  // on the calling thread (it is on the thread that loaded it).
  template <typename Params> void launch(const Params &params, const LaunchConfig &config) const {
    static_assert(std::is_trivially_copyable_v<Params> && std::is_standard_layout_v<Params>,
                  "kernel parameter blocks are plain C structs");
    void *arguments[] = {const_cast<Params *>(&params)};
    launchWithArguments(arguments, config);
  }
  // `arguments[i]` points at the i-th kernel argument, as cuLaunchKernel expects.
  void launchWithArguments(void **arguments, const LaunchConfig &config) const;

private:
  friend class LoadedModule;
  LoadedKernel(std::shared_ptr<const LoadedModule> module, const CudaDriver &driver, driver::Function function,
               std::string name);

  std::shared_ptr<const LoadedModule> module_;
  const CudaDriver *driver_ = nullptr;
  driver::Function function_ = nullptr;
  std::string name_;
};

} // namespace sage::runtime
