// What the GPU prologue tests share: device memory that frees itself, and one variant's quantization prologue compiled
// for this GPU straight from PrologueGenerator's output (no attention kernel), launched in order with one parameter
// block.
#pragma once

#include "sage/codegen/PrologueGenerator.h"
#include "sage/codegen/PrologueLaunch.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

namespace sage::test {

inline const runtime::CudaDriver &driver() { return runtime::CudaDriver::instance(); }

// Device memory that frees itself (at least 16 bytes, so that an empty tensor still has an address).
struct DeviceBuffer {
  runtime::driver::DevicePointer pointer = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t size) : bytes(std::max<size_t>(size, 16)) { pointer = driver().allocate(bytes); }
  ~DeviceBuffer() { driver().free(pointer); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  void *get() const { return reinterpret_cast<void *>(pointer); }
};

class DevicePrologue {
public:
  DevicePrologue(const AttentionVariant &variant, schedules::InputType input, const codegen::PrologueOptions &options,
                 const codegen::PrologueTunables &tunables = {})
      : source_(codegen::PrologueGenerator::generate(variant, input, variant.head_dim, tunables, options)) {
    for (const codegen::PrologueKernel &kernel : source_.kernels) {
      runtime::CompileRequest request;
      request.key = kernel.entry_point;
      request.source = kernel.source;
      request.source_name = kernel.entry_point + ".cu";
      request.options.arch = std::string(schedules::archName(runtime::currentDeviceArch()));
      modules_.push_back(runtime::LoadedModule::load(runtime::NvrtcCompiler().compileCubin(request).image));
      kernels_.push_back(modules_.back()->kernel(kernel.entry_point));
    }
  }

  size_t launches() const { return kernels_.size(); }

  // Enqueues the launches on the null stream (the one-pass plan's counters cleared first); does not synchronize.
  void run(const schedules::ProblemShape &shape, const schedules::WorkspaceLayout &layout,
           const SagePrologueParams &params) const {
    const std::vector<codegen::LaunchGrid> grids = codegen::prologueGrids(source_, shape);
    if (const size_t counter_bytes = codegen::prologueCounterBytes(source_, layout); counter_bytes > 0)
      driver().fillWordsAsync(reinterpret_cast<runtime::driver::DevicePointer>(params.workspace) +
                                  params.counters_offset,
                              0u, counter_bytes / 4, nullptr);
    for (size_t i = 0; i < kernels_.size(); ++i)
      kernels_[i].launch(params, {{grids[i].x, 1, 1},
                                  {static_cast<unsigned>(source_.kernels[i].block_threads), 1, 1},
                                  static_cast<unsigned>(source_.kernels[i].dynamic_shared_bytes),
                                  nullptr});
  }

  // The workspace after one run into a fresh one filled with 0xff (a byte nobody wrote shows); synchronizes.
  std::vector<unsigned char> workspaceAfter(const schedules::ProblemShape &shape,
                                            const schedules::WorkspaceLayout &layout, SagePrologueParams params) const {
    DeviceBuffer workspace(layout.total_bytes);
    driver().fillBytes(workspace.pointer, 0xff, workspace.bytes);
    params.workspace = static_cast<unsigned char *>(workspace.get());
    run(shape, layout, params);
    driver().synchronizeContext();
    std::vector<unsigned char> bytes(layout.total_bytes);
    driver().copyToHost(bytes.data(), workspace.pointer, bytes.size());
    return bytes;
  }

private:
  codegen::PrologueSource source_;
  std::vector<std::shared_ptr<runtime::LoadedModule>> modules_;
  std::vector<runtime::LoadedKernel> kernels_;
};

} // namespace sage::test
