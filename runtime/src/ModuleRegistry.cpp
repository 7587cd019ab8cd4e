#include "sage/runtime/ModuleRegistry.h"

namespace sage::runtime {

std::shared_ptr<const LoadedModule> ModuleRegistry::getOrLoad(std::string_view key, ByteSpan image) {
  driver::Context context = driver_->ensureContext();
  std::lock_guard lock(mutex_);
  auto [position, inserted] = modules_.try_emplace({context, std::string(key)});
  if (inserted) {
    try {
      position->second = LoadedModule::load(image, *driver_);
    } catch (...) {
      modules_.erase(position);
      throw;
    }
  }
  return position->second;
}

std::size_t ModuleRegistry::size() const {
  std::lock_guard lock(mutex_);
  return modules_.size();
}

void ModuleRegistry::clear() {
  std::lock_guard lock(mutex_);
  modules_.clear();
}

} // namespace sage::runtime
