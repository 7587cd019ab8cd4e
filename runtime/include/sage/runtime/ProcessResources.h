// What every runner of a process shares: one kernel cache (on $SAGEGEN_CACHE_DIR), one module registry and one
// AotKernelDirectory per directory. The forward, backward and SLA runners all compile and load through these, so a
// kernel is built once per process and each image is loaded once per context.
#pragma once

#include "sage/runtime/AotKernelDirectory.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/ModuleRegistry.h"

#include <filesystem>
#include <memory>

namespace sage::runtime {

KernelCache &processKernelCache();
ModuleRegistry &processModuleRegistry();
// The directory's manifest is read (and any problem reported) once per process.
std::shared_ptr<const AotKernelDirectory> processAotDirectory(const std::filesystem::path &directory);

} // namespace sage::runtime
