#include "sage/runtime/GeneratedKernelLoader.h"

#include "sage/runtime/CudaError.h"
#include "sage/runtime/ProcessResources.h"

#include <cstdio>

namespace sage::runtime {

LoadedGeneratedKernel loadGeneratedKernel(const GeneratedKernel &kernel, KernelCache &cache,
                                          const AotKernelDirectory *aot, std::optional<bool> packed) {
  LoadedGeneratedKernel loaded;
  if (aot) {
    AotLookup found = aot->find(kernel.key, packed);
    if (found.outcome == AotLookupOutcome::found) {
      try {
        loaded.module = processModuleRegistry().getOrLoad(kernel.key.digest(), found.image);
        loaded.source = CacheSource::aot;
        return loaded;
      } catch (const CudaError &error) {
        if (!CudaDriver::instance().available())
          throw; // no driver at all: compiling would not help
        // Checked before loading, but the driver has the last word: compile it instead, as for any rejected image.
        std::fprintf(stderr, "warning: sagegen AOT kernels: the driver rejected %s (%s); compiling it instead\n",
                     kernel.entry_point.c_str(), error.what());
      }
    }
  }
  const CacheResult result = cacheKernel(cache, kernel, &loaded.compile_milliseconds);
  loaded.source = result.source;
  loaded.module = processModuleRegistry().getOrLoad(result.digest, *result.image);
  return loaded;
}

std::shared_ptr<const AotKernelDirectory> aotDirectoryFor(const std::filesystem::path &option) {
  const std::filesystem::path directory = option.empty() ? AotKernelDirectory::defaultDirectory() : option;
  return directory.empty() ? nullptr : processAotDirectory(directory);
}

} // namespace sage::runtime
