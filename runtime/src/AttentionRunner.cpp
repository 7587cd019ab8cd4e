// Plan -> generate -> compile (cached) -> load, once per variant; then cheap launches.
#include "sage/runtime/AttentionRunner.h"

#include "sage/codegen/PrologueLaunch.h"
#include "sage/runtime/AotKernelDirectory.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/CudaError.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/ModuleRegistry.h"
#include "sage/runtime/NvrtcCompiler.h"

#include <fmt/core.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace sage::runtime {
namespace {

constexpr int kDefaultSharedMemoryLimit = 48 * 1024;

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

KernelCache &processCache() {
  static KernelCache cache;
  return cache;
}

ModuleRegistry &processModules() {
  static ModuleRegistry registry;
  return registry;
}

// One AotKernelDirectory per directory and process: its manifest is read (and any problem reported) once.
std::shared_ptr<const AotKernelDirectory> processAotDirectory(const std::filesystem::path &directory) {
  static std::mutex mutex;
  static std::map<std::filesystem::path, std::shared_ptr<const AotKernelDirectory>> directories;
  std::lock_guard lock(mutex);
  std::shared_ptr<const AotKernelDirectory> &slot = directories[directory];
  if (!slot)
    slot = std::make_shared<const AotKernelDirectory>(directory);
  return slot;
}

schedules::GpuArch currentArch() {
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.available())
    throw CudaError("cuInit", 0, "no CUDA driver or device: " + driver.status().reason);
  driver.ensureContext();
  ComputeCapability capability = driver.computeCapability(driver.currentDevice());
  return schedules::archFromComputeCapability(capability.major, capability.minor);
}

struct CompiledKernel {
  std::string name;
  LoadedKernel kernel;
  driver::Dim3 block;
  unsigned dynamic_shared_bytes = 0;
  CacheSource source = CacheSource::built;
  double compile_milliseconds = 0.0;
};

} // namespace

struct AttentionRunner::State {
  AttentionVariant variant;
  AttentionRunnerOptions options;
  schedules::GpuArch arch = schedules::GpuArch::sm80;
  AttentionKernelSet kernels;
  std::shared_ptr<const AotKernelDirectory> aot;
  std::vector<CompiledKernel> prologue_kernels;
  CompiledKernel attention_kernel;

  // The AOT directory's cubin when it has a valid one for `kernel`, else the cache's (built on a miss).
  CompiledKernel compile(const GeneratedKernel &kernel) {
    CompiledKernel compiled;
    compiled.name = kernel.name;
    std::shared_ptr<const ByteBuffer> image;
    const std::string digest = kernel.key.digest();
    if (aot) {
      AotLookup found = aot->find(kernel.key);
      if (found.outcome == AotLookupOutcome::found) {
        image = std::make_shared<const ByteBuffer>(std::move(found.image));
        compiled.source = CacheSource::aot;
      }
    }
    std::shared_ptr<const LoadedModule> module;
    if (image) {
      try {
        module = processModules().getOrLoad(digest, *image);
      } catch (const CudaError &error) {
        if (!CudaDriver::instance().available())
          throw; // no driver at all: compiling would not help
        // Checked before loading, but the driver has the last word: compile it instead, as for any rejected image.
        std::fprintf(stderr, "warning: sagegen AOT kernels: the driver rejected %s (%s); compiling it instead\n",
                     kernel.entry_point.c_str(), error.what());
        image.reset();
      }
    }
    if (!image) {
      CacheResult result = (options.cache ? *options.cache : processCache()).getOrBuild(kernel.key, [&] {
        const auto start = std::chrono::steady_clock::now();
        CompileRequest request;
        request.key = kernel.name + " [" + digest.substr(0, 16) + "]";
        request.source = kernel.source;
        request.source_name = kernel.name + ".cu";
        request.options.arch = kernel.key.arch;
        ByteBuffer built = NvrtcCompiler().compileCubin(request).image;
        compiled.compile_milliseconds =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        return built;
      });
      compiled.source = result.source;
      module = processModules().getOrLoad(result.digest, *result.image);
    }
    compiled.kernel = module->kernel(kernel.entry_point);
    if (kernel.dynamic_shared_bytes > kDefaultSharedMemoryLimit)
      compiled.kernel.setMaxDynamicSharedMemory(kernel.dynamic_shared_bytes);
    compiled.block = {kernel.block[0], kernel.block[1], kernel.block[2]};
    compiled.dynamic_shared_bytes = static_cast<unsigned>(kernel.dynamic_shared_bytes);
    return compiled;
  }
};

AttentionRunner::AttentionRunner(const AttentionVariant &variant, AttentionRunnerOptions options)
    : state_(std::make_unique<State>()) {
  State &state = *state_;
  state.variant = variant;
  state.options = std::move(options);
  state.arch = state.options.arch ? *state.options.arch : currentArch();
  AttentionKernelRequest request;
  request.input = state.options.input;
  request.arch = state.arch;
  request.tunables = state.options.tunables;
  request.ir_fingerprint = state.options.ir_fingerprint;
  state.kernels = generateAttentionKernels(variant, request);
  std::filesystem::path aot_directory =
      state.options.aot_directory.empty() ? AotKernelDirectory::defaultDirectory() : state.options.aot_directory;
  if (!aot_directory.empty())
    state.aot = processAotDirectory(aot_directory);

  for (const GeneratedKernel &kernel : state.kernels.kernels) {
    if (kernel.role == AttentionKernelRole::prologue)
      state.prologue_kernels.push_back(state.compile(kernel));
    else
      state.attention_kernel = state.compile(kernel);
  }
}

AttentionRunner::~AttentionRunner() = default;

const AttentionVariant &AttentionRunner::variant() const { return state_->variant; }

size_t AttentionRunner::workspaceBytes(const schedules::ProblemShape &shape) const {
  return schedules::computeWorkspaceLayout(state_->variant, shape).total_bytes;
}

void AttentionRunner::run(const schedules::ProblemShape &shape, const AttentionTensors &tensors, void *workspace,
                          size_t workspace_bytes, driver::Stream stream, RunPhase phase) const {
  const State &state = *state_;
  require(shape.batch > 0 && shape.heads_q > 0 && shape.heads_kv > 0 && shape.tokens_q > 0 && shape.tokens_kv > 0,
          "shape: batch, heads_q, heads_kv, tokens_q and tokens_kv must be positive");
  require(shape.heads_q % shape.heads_kv == 0,
          fmt::format("shape: heads_q ({}) must be a multiple of heads_kv ({})", shape.heads_q, shape.heads_kv));
  require(shape.head_dim == state.variant.head_dim,
          fmt::format("shape: head_dim {} does not match the kernel's {}", shape.head_dim, state.variant.head_dim));
  require(tensors.q && tensors.k && tensors.v && tensors.o, "q, k, v, o: device pointers must not be null");
  require(reinterpret_cast<uintptr_t>(tensors.o) % 4 == 0 && tensors.o_strides.token % 2 == 0,
          "o: must be 4-byte aligned with even strides");
  require(state.variant.mask.kind != MaskKind::block_sparse || tensors.block_mask,
          "block_mask: the variant is block_sparse and needs a block mask");
  const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(state.variant, shape);
  require(workspace && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
          "workspace: must be a non-null, 256-byte aligned device pointer");
  require(workspace_bytes >= layout.total_bytes,
          fmt::format("workspace: {} bytes given, {} needed", workspace_bytes, layout.total_bytes));

  if (phase != RunPhase::attention) {
    // psi_Q, gamma(K) and psi_K, psi_V: fill the workspace (makePrologueParams checks Q/K/V alignment)
    const SagePrologueParams params = codegen::makePrologueParams(
        state.variant, shape, layout, {tensors.q, tensors.q_strides}, {tensors.k, tensors.k_strides},
        {tensors.v, tensors.v_strides}, static_cast<unsigned char *>(workspace));
    const std::vector<codegen::LaunchGrid> grids = codegen::prologueGrids(state.kernels.prologue, shape);
    for (size_t i = 0; i < state.prologue_kernels.size(); ++i) {
      const CompiledKernel &kernel = state.prologue_kernels[i];
      kernel.kernel.launch(params,
                           {{grids[i].x, grids[i].y, grids[i].z}, kernel.block, kernel.dynamic_shared_bytes, stream});
    }
  }
  if (phase == RunPhase::prologue)
    return;

  SageAttentionParams params{};
  params.workspace = static_cast<const unsigned char *>(workspace);
  params.offsets = {layout.q_codes.offset,  layout.q_scales.offset, layout.k_codes.offset,  layout.k_scales.offset,
                    layout.k_mean.offset,   layout.q_mean.offset,   layout.v_values.offset, layout.v_codes.offset,
                    layout.v_scales.offset, layout.v_mean.offset};
  params.v = tensors.v;
  params.v_strides = tensors.v_strides;
  params.o = tensors.o;
  params.o_strides = tensors.o_strides;
  params.lse = tensors.lse;
  params.block_mask = tensors.block_mask;
  params.size = {static_cast<int>(shape.batch),         static_cast<int>(shape.heads_q),
                 static_cast<int>(shape.heads_kv),      static_cast<int>(shape.tokens_q),
                 static_cast<int>(shape.tokens_kv),     static_cast<int>(layout.padded_q),
                 static_cast<int>(layout.padded_kv),    static_cast<int>(layout.q_scale_count),
                 static_cast<int>(layout.k_scale_count)};
  params.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(state.variant.head_dim)));
  const auto grid = state.kernels.attention.grid.gridFor(shape);
  const CompiledKernel &kernel = state.attention_kernel;
  kernel.kernel.launch(
      params, {{static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2])},
               kernel.block,
               kernel.dynamic_shared_bytes,
               stream});
}

std::string AttentionRunner::describe() const {
  const State &state = *state_;
  std::string text = fmt::format("{} on {} with {} ({}):", state.variant.name, schedules::archName(state.arch),
                                 state.kernels.plan.schedule, schedules::tunablesText(state.kernels.plan.tunables));
  auto add = [&](const CompiledKernel &kernel) {
    text += fmt::format(" {} [{}{}]", kernel.name, cacheSourceName(kernel.source),
                        kernel.source == CacheSource::built ? fmt::format(" {:.0f} ms", kernel.compile_milliseconds)
                                                            : std::string());
  };
  for (const CompiledKernel &kernel : state.prologue_kernels)
    add(kernel);
  add(state.attention_kernel);
  return text;
}

} // namespace sage::runtime
