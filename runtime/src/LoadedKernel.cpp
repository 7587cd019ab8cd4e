#include "sage/runtime/LoadedKernel.h"

#include "sage/runtime/CudaError.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::runtime {
namespace {

bool isElf(ByteSpan image) {
  return image.size() >= 4 && image[0] == 0x7f && image[1] == 'E' && image[2] == 'L' && image[3] == 'F';
}

} // namespace

std::shared_ptr<LoadedModule> LoadedModule::load(ByteSpan image, const CudaDriver &driver) {
  if (image.empty())
    throw std::invalid_argument("LoadedModule::load: the image is empty (expected a cubin or PTX text)");
  driver::Context context = driver.ensureContext();
  driver::Device device = driver.currentDevice();
  driver::Module module = nullptr;
  if (isElf(image) || image.back() == 0) {
    module = driver.loadModule(image.data());
  } else {
    // PTX text must be NUL-terminated for the driver.
    std::string ptx(image.begin(), image.end());
    module = driver.loadModule(ptx.c_str());
  }
  return std::shared_ptr<LoadedModule>(new LoadedModule(driver, module, context, device));
}

LoadedModule::LoadedModule(const CudaDriver &driver, driver::Module module, driver::Context context,
                           driver::Device device)
    : driver_(&driver), module_(module), context_(context), device_(device) {}

LoadedModule::~LoadedModule() { driver_->unloadModule(module_, context_); }

LoadedKernel LoadedModule::kernel(const std::string &name) const {
  return LoadedKernel(shared_from_this(), *driver_, driver_->moduleFunction(module_, name.c_str()), name);
}

LoadedKernel::LoadedKernel(std::shared_ptr<const LoadedModule> module, const CudaDriver &driver,
                           driver::Function function, std::string name)
    : module_(std::move(module)), driver_(&driver), function_(function), name_(std::move(name)) {}

void LoadedKernel::setMaxDynamicSharedMemory(int bytes) const {
  int limit = driver_->deviceAttribute(driver::DeviceAttribute::max_shared_memory_per_block_optin, module_->device());
  int static_bytes = attribute(driver::FunctionAttribute::shared_size_bytes);
  if (bytes < 0 || bytes + static_bytes > limit)
    throw std::invalid_argument(fmt::format("setMaxDynamicSharedMemory: kernel '{}' asks for {} bytes of dynamic "
                                            "shared memory; with its {} static bytes the device allows at most {}",
                                            name_, bytes, static_bytes, std::max(0, limit - static_bytes)));
  driver_->setFunctionAttribute(function_, driver::FunctionAttribute::max_dynamic_shared_size_bytes, bytes);
}

int LoadedKernel::attribute(driver::FunctionAttribute attribute) const {
  return driver_->functionAttribute(function_, attribute);
}

void LoadedKernel::launchWithArguments(void **arguments, const LaunchConfig &config) const {
  driver_->launchKernel(function_, config.grid, config.block, config.dynamic_shared_bytes, config.stream, arguments);
}

} // namespace sage::runtime
