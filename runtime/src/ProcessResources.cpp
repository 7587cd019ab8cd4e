#include "sage/runtime/ProcessResources.h"

#include <map>
#include <mutex>

namespace sage::runtime {

KernelCache &processKernelCache() {
  static KernelCache cache;
  return cache;
}

ModuleRegistry &processModuleRegistry() {
  static ModuleRegistry registry;
  return registry;
}

std::shared_ptr<const AotKernelDirectory> processAotDirectory(const std::filesystem::path &directory) {
  static std::mutex mutex;
  static std::map<std::filesystem::path, std::shared_ptr<const AotKernelDirectory>> directories;
  std::lock_guard lock(mutex);
  std::shared_ptr<const AotKernelDirectory> &slot = directories[directory];
  if (!slot)
    slot = std::make_shared<const AotKernelDirectory>(directory);
  return slot;
}

} // namespace sage::runtime
