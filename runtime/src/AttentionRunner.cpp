// Plan -> generate -> compile (cached) -> load, once per variant; then cheap launches.
#include "sage/runtime/AttentionRunner.h"

#include "sage/codegen/PrologueLaunch.h"
#include "sage/dsl/Attention.h"
#include "sage/ir/Program.h"
#include "sage/runtime/AotKernelDirectory.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/CudaError.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GeneratedKernelLoader.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/ModuleRegistry.h"
#include "sage/runtime/ProcessResources.h"
#include "sage/runtime/Sm90TensorMaps.h"
#include "sage/runtime/TensorValidation.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/UnsupportedError.h"

#include <fmt/core.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace sage::runtime {
namespace {

constexpr int kDefaultSharedMemoryLimit = 48 * 1024;

// What run() derives from the problem shape alone, kept for the last shape seen: repeated calls with one shape
// (the common case) skip the layout and grid computations.
struct ShapePlan {
  schedules::ProblemShape shape;
  schedules::WorkspaceLayout layout;
  std::vector<codegen::LaunchGrid> prologue_grids;
  size_t prologue_counter_bytes = 0; // zeroed on the stream before a one-pass prologue
  std::array<int64_t, 3> attention_grid{};
};

bool sameShape(const schedules::ProblemShape &a, const schedules::ProblemShape &b) {
  return a.batch == b.batch && a.heads_q == b.heads_q && a.heads_kv == b.heads_kv && a.tokens_q == b.tokens_q &&
         a.tokens_kv == b.tokens_kv && a.head_dim == b.head_dim;
}

// The database at TuningDatabase::defaultPath(), read at the first runner without explicit tunables. A corrupt file
// is reported once and ignored (`sagegen tune` moves it aside when it next writes).
std::shared_ptr<const TuningDatabase> processTuningDatabase() {
  static const std::shared_ptr<const TuningDatabase> database = [] {
    try {
      return std::make_shared<const TuningDatabase>(TuningDatabase::read(TuningDatabase::defaultPath()));
    } catch (const TuningDatabaseError &error) {
      fmt::print(stderr, "sagegen: warning: ignoring the tuning database: {}\n", error.what());
      return std::make_shared<const TuningDatabase>();
    }
  }();
  return database;
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
  AttentionKernelSet kernels; // plan, generated sources, launch geometry and keys
  std::shared_ptr<const AotKernelDirectory> aot;
  std::vector<CompiledKernel> prologue_kernels;
  CompiledKernel attention_kernel;
  bool load_modules = true;          // false: compile into the cache only (no GPU)
  int device = 0;                    // the CUDA device the kernels are loaded on
  int multiprocessors = 0;           // its SM count (a persistent kernel's grid)
  driver::Context context = nullptr; // where they were loaded (made current around every launch)
  KernelRequirements requirements;   // what run(AttentionCall) checks against
  bool qk_copies_only = false;       // sm90 plan whose prologue only copies Q and K (prologueOnlyCopiesQk)
  std::string tunables_origin;       // where the plan's tunables came from, for describe()
  mutable std::mutex shape_plan_mutex;
  mutable std::shared_ptr<const ShapePlan> last_shape_plan;
  mutable std::mutex packed_mutex;
  mutable std::unique_ptr<AttentionRunner> packed_runner;             // packedRunner(), built at the first packed call
  mutable std::atomic<const AttentionRunner *> packed_ready{nullptr}; // packed_runner once built: no lock per call
  mutable TensorMapCache tensor_maps; // the sm90 maps of the last call: unchanged ones are not encoded again

  std::shared_ptr<const ShapePlan> planFor(const schedules::ProblemShape &shape) const {
    {
      std::lock_guard<std::mutex> lock(shape_plan_mutex);
      if (last_shape_plan && sameShape(last_shape_plan->shape, shape))
        return last_shape_plan;
    }
    auto shape_plan = std::make_shared<ShapePlan>();
    shape_plan->shape = shape;
    shape_plan->layout = schedules::computeWorkspaceLayout(variant, shape, options.input);
    shape_plan->prologue_grids = codegen::prologueGrids(kernels.prologue, shape);
    shape_plan->prologue_counter_bytes = codegen::prologueCounterBytes(kernels.prologue, shape_plan->layout);
    shape_plan->attention_grid = kernels.attention.grid.gridFor(shape, multiprocessors);
    const auto &grid = shape_plan->attention_grid;
    if (grid[0] > std::numeric_limits<int32_t>::max() || grid[1] > 65535 || grid[2] > 65535)
      throw ArgumentError("shape", fmt::format("the attention grid ({}, {}, {}) exceeds the launch limits "
                                               "(2^31-1, 65535, 65535): tokens_q, heads_q or batch is too large",
                                               grid[0], grid[1], grid[2]));
    std::lock_guard<std::mutex> lock(shape_plan_mutex);
    last_shape_plan = shape_plan;
    return shape_plan;
  }

  // The tunables to build with: the caller's; else the tuning database's entry for this GPU and problem when the
  // schedule accepts it; else none (the schedule's defaults).
  std::optional<schedules::Tunables> chooseTunables() {
    tunables_origin = options.tunables ? "given" : "schedule defaults";
    if (options.tunables || !load_modules)
      return options.tunables;
    const std::shared_ptr<const TuningDatabase> database = options.tuning ? options.tuning : processTuningDatabase();
    if (database->empty())
      return std::nullopt;
    TuningQuery query;
    query.device = currentTuningDevice(std::string(schedules::archName(arch)));
    query.variant_names = {variant.name, options.ir_fingerprint};
    query.head_dim = variant.head_dim;
    query.causal = variant.mask.kind == MaskKind::causal;
    query.input = std::string(schedules::nameOf(options.input));
    query.tokens_hint = options.tokens_hint;
    const std::optional<TuningEntry> entry = database->lookup(query);
    if (!entry)
      return std::nullopt;
    try {
      const schedules::Tunables tuned = schedules::parseTunables(entry->tunables, schedules::Tunables{});
      // The schedule's verdict on them (a database entry may be another schedule's tunables).
      if (options.schedule.empty())
        schedules::planBestSchedule(variant, arch, options.input, tuned);
      else if (const schedules::Schedule *schedule = schedules::findSchedule(options.schedule))
        schedule->plan(variant, arch, options.input, tuned);
      tunables_origin = fmt::format("tuned for N={} on {}", entry->tokens, query.device.gpu);
      return tuned;
    } catch (const std::invalid_argument &error) {
      tunables_origin = fmt::format("schedule defaults; the tuned {} was refused: {}", entry->tunables, error.what());
      return std::nullopt;
    }
  }

  void build() {
    AttentionKernelRequest request;
    request.input = options.input;
    request.arch = arch;
    request.tunables = chooseTunables();
    request.ir_fingerprint = options.ir_fingerprint;
    request.schedule = options.schedule;
    kernels = generateAttentionKernels(variant, request);
    if (load_modules)
      aot = aotDirectoryFor(options.aot_directory);
    for (const GeneratedKernel &kernel : kernels.kernels) {
      if (kernel.role == AttentionKernelRole::prologue)
        prologue_kernels.push_back(compile(kernel));
      else
        attention_kernel = compile(kernel);
    }
    // A packed call's Q and K are never in the workspace's layout (sequences are gathered into padded slots).
    qk_copies_only = kernels.plan.warp_specialization.consumer_warpgroups > 0 && !variant.packed_sequences &&
                     codegen::prologueOnlyCopiesQk(variant, options.input);
  }

  // A call's launches (AttentionRunner::run); `regions`: a validated call's tensors, checked against the workspace.
  void run(const schedules::ProblemShape &shape, const AttentionTensors &tensors, void *workspace,
           size_t workspace_bytes, driver::Stream stream, RunPhase phase, const MemoryRegions *regions,
           std::string_view sizing) const;

  // The AOT directory's cubin when it has a valid one for `kernel`, else the cache's (built on a miss).
  CompiledKernel compile(const GeneratedKernel &kernel) {
    CompiledKernel compiled;
    compiled.name = kernel.name;
    KernelCache &cache = options.cache ? *options.cache : processKernelCache();
    if (!load_modules) {
      compiled.source = cacheKernel(cache, kernel, &compiled.compile_milliseconds).source;
      return compiled;
    }
    const LoadedGeneratedKernel loaded = loadGeneratedKernel(kernel, cache, aot.get(), variant.packed_sequences);
    compiled.source = loaded.source;
    compiled.compile_milliseconds = loaded.compile_milliseconds;
    const std::shared_ptr<const LoadedModule> &module = loaded.module;
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
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.available())
    throw CudaError("cuInit", 0, "no CUDA driver or device: " + driver.status().reason);
  if (state.options.device) {
    const int device = *state.options.device;
    if (device < 0 || device >= driver.status().device_count)
      throw ArgumentError("device", fmt::format("expected a CUDA device ordinal from 0 to {}, got {}",
                                                driver.status().device_count - 1, device));
    state.device = device;
    state.context = driver.primaryContext(device);
  } else {
    state.context = driver.ensureContext(); // the caller's current context, else device 0's primary one
    state.device = driver.currentDevice();
  }
  // Loads (and asks the arch of) the chosen device's context, whatever the caller's thread has current.
  ScopedContext scope(driver, state.context);
  state.arch = state.options.arch ? *state.options.arch : currentDeviceArch();
  state.multiprocessors = driver.deviceAttribute(driver::DeviceAttribute::multiprocessor_count, state.device);
  if (const char *schedule = std::getenv("SAGEGEN_SCHEDULE"); state.options.schedule.empty() && schedule && *schedule)
    state.options.schedule = schedule; // a process-wide choice, for benchmarks and for working around a schedule
  state.build();
  KernelRequirements &requirements = state.requirements;
  requirements.head_dim = variant.head_dim;
  requirements.input = state.options.input;
  requirements.writes_lse = variant.epilogue.write_lse;
  requirements.block_sparse = variant.mask.kind == MaskKind::block_sparse;
  requirements.block_q = state.kernels.plan.tunables.block_q;
  requirements.block_kv = state.kernels.plan.tunables.block_kv;
  requirements.device = state.device;
}

void AttentionRunner::compileKernels(const AttentionVariant &variant, const AttentionRunnerOptions &options) {
  if (!options.arch)
    throw std::invalid_argument("compileKernels: options.arch must be set (there may be no GPU to ask)");
  State state;
  state.variant = variant;
  state.options = options;
  state.arch = *options.arch;
  state.load_modules = false;
  state.build();
}

AttentionRunner::~AttentionRunner() = default;

const AttentionVariant &AttentionRunner::variant() const { return state_->variant; }

size_t AttentionRunner::launchCount() const { return state_->prologue_kernels.size() + 1; }

const KernelRequirements &AttentionRunner::requirements() const { return state_->requirements; }

int AttentionRunner::device() const { return state_->device; }

size_t AttentionRunner::workspaceBytes(const AttentionCall &call) const {
  return workspaceBytes(problemShapeOf(call.q, call.k, call.layout, state_->requirements));
}

void AttentionRunner::run(const AttentionCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream,
                          RunPhase phase) const {
  if (phase != RunPhase::all && phase != RunPhase::prologue && phase != RunPhase::attention)
    throw ArgumentError("phase", "expected all, prologue or attention");
  run(validateAttentionCall(call, state_->requirements), workspace, workspace_bytes, stream, phase,
      "AttentionRunner::workspaceBytes");
}

const AttentionRunner &AttentionRunner::packedRunner() const {
  const State &state = *state_;
  if (state.variant.packed_sequences)
    return *this;
  if (const AttentionRunner *ready = state.packed_ready.load(std::memory_order_acquire))
    return *ready;
  std::lock_guard<std::mutex> lock(state.packed_mutex);
  if (!state.packed_runner) {
    const auto unsupported = [&](const std::exception &error) {
      return schedules::UnsupportedError(
          fmt::format("packed (variable-length) calls of {}: {}", state.variant.name, error.what()));
    };
    AttentionVariant packed;
    AttentionRunnerOptions options = state.options;
    try { // the packed IR's fingerprint: its kernels' keys differ from the dense ones by the IR
      packed = packedSequencesOf(state.variant);
      options.ir_fingerprint = dsl::emitProgram(packed).fingerprint();
    } catch (const ir::ProgramError &error) { // the verifier's reason why this variant cannot be packed
      throw unsupported(error);
    } catch (const std::invalid_argument &error) { // packedSequencesOf's reason
      throw unsupported(error);
    }
    // In this runner's context (a device's primary one, or the caller's current one at construction), whatever the
    // thread has current now: the packed kernels launch on the same streams.
    ScopedContext scope(CudaDriver::instance(), state.context);
    state.packed_runner = std::make_unique<AttentionRunner>(packed, std::move(options));
    state.packed_ready.store(state.packed_runner.get(), std::memory_order_release);
  }
  return *state.packed_runner;
}

size_t AttentionRunner::varlenWorkspaceBytes(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t max_seqlen_q,
                                             int64_t max_seqlen_kv) const {
  const AttentionRunner &packed = packedRunner();
  return packed.workspaceBytes(
      varlenProblemShape(batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_kv, packed.requirements()));
}

void AttentionRunner::run(const VarlenCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream,
                          RunPhase phase) const {
  if (phase != RunPhase::all && phase != RunPhase::prologue && phase != RunPhase::attention)
    throw ArgumentError("phase", "expected all, prologue or attention");
  const AttentionRunner &packed = packedRunner();
  packed.run(validateVarlenCall(call, packed.requirements()), workspace, workspace_bytes, stream, phase,
             "AttentionRunner::varlenWorkspaceBytes");
}

size_t AttentionRunner::workspaceBytes(const schedules::ProblemShape &shape) const {
  // Through the plan cache: the C ABI sizes the workspace on every run (its overlap check), and the run that follows
  // finds the same plan.
  return state_->planFor(shape)->layout.total_bytes;
}

void AttentionRunner::run(const schedules::ProblemShape &shape, const AttentionTensors &tensors, void *workspace,
                          size_t workspace_bytes, driver::Stream stream, RunPhase phase) const {
  state_->run(shape, tensors, workspace, workspace_bytes, stream, phase, nullptr, {});
}

void AttentionRunner::run(const ValidatedCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream,
                          RunPhase phase, std::string_view sizing) const {
  if (phase != RunPhase::all && phase != RunPhase::prologue && phase != RunPhase::attention)
    throw ArgumentError("phase", "expected all, prologue or attention");
  state_->run(call.shape, call.tensors, workspace, workspace_bytes, stream, phase, &call.regions, sizing);
}

void AttentionRunner::State::run(const schedules::ProblemShape &shape, const AttentionTensors &tensors, void *workspace,
                                 size_t workspace_bytes, driver::Stream stream, RunPhase phase,
                                 const MemoryRegions *regions, std::string_view sizing) const {
  const State &state = *this;
  // The hot path: every check is a comparison; messages are built only when one fails.
  if (shape.batch <= 0 || shape.heads_q <= 0 || shape.heads_kv <= 0 || shape.tokens_q <= 0 || shape.tokens_kv <= 0)
    throw std::invalid_argument("shape: batch, heads_q, heads_kv, tokens_q and tokens_kv must be positive");
  if (shape.heads_q % shape.heads_kv != 0)
    throw std::invalid_argument(
        fmt::format("shape: heads_q ({}) must be a multiple of heads_kv ({})", shape.heads_q, shape.heads_kv));
  if (shape.head_dim != state.variant.head_dim)
    throw std::invalid_argument(
        fmt::format("shape: head_dim {} does not match the kernel's {}", shape.head_dim, state.variant.head_dim));
  if (!tensors.q || !tensors.k || !tensors.v || !tensors.o)
    throw std::invalid_argument("q, k, v, o: device pointers must not be null");
  if (reinterpret_cast<uintptr_t>(tensors.o) % 4 != 0 || tensors.o_strides.token % 2 != 0)
    throw std::invalid_argument("o: must be 4-byte aligned with even strides");
  const bool packed = state.variant.packed_sequences;
  if (packed && (!tensors.sequences.q || !tensors.sequences.kv))
    throw std::invalid_argument("sequences: a packed attention needs cu_seqlens_q and cu_seqlens_kv (a VarlenCall)");
  if (!packed && (tensors.sequences.q || tensors.sequences.kv))
    throw std::invalid_argument("sequences: a dense attention takes no cu_seqlens (run a VarlenCall: packedRunner())");
  const std::shared_ptr<const ShapePlan> shape_plan = state.planFor(shape); // the one plan lookup of a call
  const schedules::WorkspaceLayout &layout = shape_plan->layout;
  if (regions) // a validated call: the workspace's size, alignment and overlap with the call's tensors
    checkWorkspace(*regions, workspace, workspace_bytes, layout.total_bytes, 256, sizing);
  if (!workspace || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    throw std::invalid_argument("workspace: must be a non-null, 256-byte aligned device pointer");
  if (workspace_bytes < layout.total_bytes)
    throw std::invalid_argument(
        fmt::format("workspace: {} bytes given, {} needed", workspace_bytes, layout.total_bytes));

  // The kernels belong to this runner's device: launch them in its context, whatever the thread has current.
  ScopedContext scope(CudaDriver::instance(), state.context);
  if (state.kernels.plan.warp_specialization.consumer_warpgroups > 0) // before anything is launched
    if (const std::string problem =
            valueTensorProblem(state.kernels.plan, valueTensorShape(state.kernels.plan, shape, tensors.sequences),
                               {tensors.v, tensors.v_strides});
        !problem.empty())
      throw std::invalid_argument(problem);

  // In a whole call, a prologue that would only copy Q and K is skipped where they already are in the workspace's
  // layout (compact head-major, whole blocks): the sm90 kernel's tensor maps then read them in place (SLA's sparse
  // part: 0.18 ms at N = 32k, h = 16, d = 128 on an H100). The split phases keep their contract (the workspace).
  const codegen::PrologueTensor q_tensor{tensors.q, tensors.q_strides}, k_tensor{tensors.k, tensors.k_strides};
  const bool qk_in_place =
      state.qk_copies_only && phase == RunPhase::all &&
      q_tensor.inWorkspaceLayout(shape.batch, shape.heads_q, shape.tokens_q, layout.padded_q, shape.head_dim) &&
      k_tensor.inWorkspaceLayout(shape.batch, shape.heads_kv, shape.tokens_kv, layout.padded_kv, shape.head_dim);
  // A persistent sm90 kernel's CTAs claim tiles from a counter that starts at zero: the prologue of a whole call
  // clears it (SagePrologueParams::cleared_word_offset), else a memset before the kernel does.
  bool counter_cleared = false;
  if (phase != RunPhase::attention && !qk_in_place) {
    // psi_Q, gamma(K) and psi_K, psi_V: fill the workspace (makePrologueParams checks Q/K/V alignment)
    SagePrologueParams params =
        codegen::makePrologueParams(state.variant, shape, layout, q_tensor, k_tensor, {tensors.v, tensors.v_strides},
                                    static_cast<unsigned char *>(workspace));
    params.sequences = tensors.sequences; // packed: each sequence gathered into its batch slot
    if (phase == RunPhase::all && claimsTiles(state.kernels.plan) && !state.prologue_kernels.empty()) {
      params.cleared_word_offset = layout.attention_counters.offset;
      counter_cleared = true;
    }
    const std::vector<codegen::LaunchGrid> &grids = shape_plan->prologue_grids;
    if (shape_plan->prologue_counter_bytes > 0) // the one-pass prologue's ticket and per-head counts start at zero
      CudaDriver::instance().fillWordsAsync(reinterpret_cast<driver::DevicePointer>(workspace) +
                                                layout.prologue_counters.offset,
                                            0u, shape_plan->prologue_counter_bytes / 4, stream);
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
                    layout.v_scales.offset, layout.v_mean.offset,   layout.delta_s.offset};
  params.q = tensors.q;
  params.q_strides = tensors.q_strides;
  params.v = tensors.v;
  params.v_strides = tensors.v_strides;
  params.o = tensors.o;
  params.o_strides = tensors.o_strides;
  params.lse = tensors.lse;
  params.lse_strides = packed ? SageLseStrides{0, tensors.sequences.total_q}                    // packed [h_q, total_q]
                              : SageLseStrides{shape.heads_q * shape.tokens_q, shape.tokens_q}; // [b, h_q, tokens_q]
  params.block_mask = tensors.block_mask;
  params.size = {static_cast<int>(shape.batch),         static_cast<int>(shape.heads_q),
                 static_cast<int>(shape.heads_kv),      static_cast<int>(shape.tokens_q),
                 static_cast<int>(shape.tokens_kv),     static_cast<int>(layout.padded_q),
                 static_cast<int>(layout.padded_kv),    static_cast<int>(layout.q_scale_count),
                 static_cast<int>(layout.k_scale_count)};
  params.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(state.variant.head_dim)));
  // Packed: the offset is each sequence's own (the kernel adds length_kv - length_q where bottom-right).
  params.causal_offset =
      packed ? 0 : static_cast<int>(causalOffset(tensors.causal_alignment, shape.tokens_q, shape.tokens_kv));
  params.sequences = tensors.sequences;
  params.causal_bottom_right = packed && tensors.causal_alignment == CausalAlignment::bottom_right ? 1 : 0;
  const auto &grid = shape_plan->attention_grid;
  const CompiledKernel &kernel = state.attention_kernel;
  const LaunchConfig launch{
      {static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2])},
      kernel.block,
      kernel.dynamic_shared_bytes,
      stream};
  if (state.kernels.plan.warp_specialization.consumer_warpgroups > 0) { // sm90: the TMA tensor maps of this call
    const SageSm90AttentionParams sm90 =
        makeSm90AttentionParams(state.kernels.plan, shape, layout, params, {tensors.v, tensors.v_strides},
                                qk_in_place ? QkRows{tensors.q, tensors.k} : QkRows{}, &state.tensor_maps);
    if (sm90.tile_counter != nullptr && !counter_cleared) // a persistent kernel's CTAs claim tiles from zero
      CudaDriver::instance().fillWordsAsync(reinterpret_cast<driver::DevicePointer>(sm90.tile_counter), 0u, 1, stream);
    kernel.kernel.launch(sm90, launch);
  } else
    kernel.kernel.launch(params, launch);
}

std::string AttentionRunner::describe() const {
  const State &state = *state_;
  std::string text = fmt::format("{} on {} with {} ({}; {}):", state.variant.name, schedules::archName(state.arch),
                                 state.kernels.plan.schedule, schedules::tunablesText(state.kernels.plan.tunables),
                                 state.tunables_origin);
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
