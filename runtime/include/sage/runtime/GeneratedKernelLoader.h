// One generated kernel module (AttentionKernelSet.h, AuxiliaryKernels.h) made loaded in the calling thread's current
// context: from an ahead-of-time directory when it holds a valid cubin for the kernel's key, else from the kernel
// cache (compiled with NVRTC on a miss). The forward, backward and SLA runners all load their kernels this way.
#pragma once

#include "sage/runtime/AotKernelDirectory.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/LoadedKernel.h"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace sage::runtime {

struct LoadedGeneratedKernel {
  std::shared_ptr<const LoadedModule> module;
  CacheSource source = CacheSource::built; // aot, memory, disk or built
  double compile_milliseconds = 0.0;       // when built
};

// `aot` may be null. An AOT image the driver refuses is reported on stderr and compiled instead. `packed`: whether the
// kernel is a packed variable-length variant's, where the caller knows (AotKernelDirectory::find never serves an
// entry of the other kind then). Throws CompileError, CudaError.
LoadedGeneratedKernel loadGeneratedKernel(const GeneratedKernel &kernel, KernelCache &cache,
                                          const AotKernelDirectory *aot, std::optional<bool> packed = std::nullopt);

// The process's AotKernelDirectory for a runner's option: `option` if given, else $SAGEGEN_AOT_DIR; null if neither.
std::shared_ptr<const AotKernelDirectory> aotDirectoryFor(const std::filesystem::path &option);

} // namespace sage::runtime
