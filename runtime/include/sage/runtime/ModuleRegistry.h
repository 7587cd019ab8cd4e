// Loaded modules by cache key and context, so each image is loaded once per context however many times it is
// asked for. Lookups lock; callers keep the returned kernels for the hot path.
#pragma once

#include "sage/runtime/LoadedKernel.h"

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace sage::runtime {

class ModuleRegistry {
public:
  explicit ModuleRegistry(const CudaDriver &driver = CudaDriver::instance()) : driver_(&driver) {}

  // The module loaded for `key` in the calling thread's context (ensured as LoadedModule::load does), loading
  // `image` the first time.
  std::shared_ptr<const LoadedModule> getOrLoad(std::string_view key, ByteSpan image);

  std::size_t size() const;
  // Forgets every module; each is unloaded once no kernel taken from it remains.
  void clear();

private:
  const CudaDriver *driver_;
  mutable std::mutex mutex_;
  std::map<std::pair<driver::Context, std::string>, std::shared_ptr<const LoadedModule>, std::less<>> modules_;
};

} // namespace sage::runtime
