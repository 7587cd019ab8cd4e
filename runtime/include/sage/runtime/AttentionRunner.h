// One attention variant made runnable: its schedule plan, its prologue and attention kernels compiled with
// NVRTC through the kernel cache, and launches on a caller's stream with a caller's workspace.
#pragma once

#include "sage/codegen/KernelAbi.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/runtime/AttentionCall.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/runtime/VarlenCall.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/Tunables.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sage::runtime {

struct AttentionRunnerOptions {
  schedules::InputType input = schedules::InputType::f16;
  // The CUDA device whose primary context the kernels are loaded into and launched in. Default: the device of the
  // calling thread's current context (that context itself), else device 0.
  std::optional<int> device;
  std::optional<schedules::GpuArch> arch;      // default: the device's
  std::optional<schedules::Tunables> tunables; // default: the tuning database's for this GPU, else the schedule's
  std::string ir_fingerprint;                  // the IR part of the cache key (ir::Program::fingerprint)
  // A schedule by name (e.g. "sm80.mma_sync"); empty: $SAGEGEN_SCHEDULE if set, else the best one for the arch.
  std::string schedule;
  KernelCache *cache = nullptr;                 // default: a process-wide cache on $SAGEGEN_CACHE_DIR
  std::shared_ptr<const TuningDatabase> tuning; // default: TuningDatabase::defaultPath(), read once per process
  int64_t tokens_hint = 0;                      // the N to pick a tuned entry for (0: the entry with the largest N)
  // Ahead-of-time kernels (`sagegen emit` output), looked up before the cache. Empty: $SAGEGEN_AOT_DIR; neither
  // set: none. Only a cubin whose stored key equals the kernel's key is used; anything else is compiled.
  std::filesystem::path aot_directory;
};

enum class RunPhase { all, prologue, attention };

class AttentionRunner {
public:
  // Plans and compiles (or finds in the cache) every kernel. Throws std::invalid_argument when no schedule
  // supports the variant (the message has each schedule's reason), CompileError, or CudaError.
  AttentionRunner(const AttentionVariant &variant, AttentionRunnerOptions options);
  // Plans and compiles every kernel into the cache without loading them: no GPU needed (options.arch must be set),
  // safe to call from several threads (`sagegen tune` compiles its candidates this way).
  static void compileKernels(const AttentionVariant &variant, const AttentionRunnerOptions &options);
  ~AttentionRunner();
  AttentionRunner(const AttentionRunner &) = delete;
  AttentionRunner &operator=(const AttentionRunner &) = delete;

  size_t workspaceBytes(const schedules::ProblemShape &shape) const;
  // The workspace for the problem of q and k (checked as run(AttentionCall) checks them).
  size_t workspaceBytes(const AttentionCall &call) const;
  // Validates every tensor description against the kernels (validateAttentionCall: ArgumentError naming the
  // argument), then launches on `stream`, which must belong to this runner's device.
  void run(const AttentionCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream,
           RunPhase phase = RunPhase::all) const;
  // For C++ callers that already hold raw pointers: checks the shape, pointer alignment and workspace, but cannot
  // check the tensors' sizes, dtypes or devices (run(AttentionCall) can).
  void run(const schedules::ProblemShape &shape, const AttentionTensors &tensors, void *workspace,
           size_t workspace_bytes, driver::Stream stream, RunPhase phase = RunPhase::all) const;

  // A call already validated against this runner's requirements() (validateAttentionCall; validateVarlenCall against
  // packedRunner()'s, run on packedRunner()): the workspace checked against this shape's size, 256-byte alignment
  // and the call's tensors (no overlap), `sizing` naming the function that gives the size in errors; then launched.
  // One plan lookup per call: the C ABI's path.
  void run(const ValidatedCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream, RunPhase phase,
           std::string_view sizing) const;
  // Packed variable-length calls (VarlenCall.h) run on the runner of this variant's packed form
  // (AttentionVariant::packed_sequences; its own plan and kernels, cached like these): built at the first packed call
  // and kept. It throws schedules::UnsupportedError, with the reason, where nothing runs the packed form (SLA,
  // block-sparse, FP4, ...). A runner of a packed variant is its own packed runner.
  const AttentionRunner &packedRunner() const;
  // The workspace of a packed call of `batch` sequences: the dense call's of shape (batch, heads, max lengths).
  size_t varlenWorkspaceBytes(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t max_seqlen_q,
                              int64_t max_seqlen_kv) const;
  // Validates the call (validateVarlenCall: descriptors only, never the offsets' values), then launches the packed
  // runner's prologue and attention kernel on `stream`.
  void run(const VarlenCall &call, void *workspace, size_t workspace_bytes, driver::Stream stream,
           RunPhase phase = RunPhase::all) const;

  // What the kernels accept: head dim, dtype, LSE, block mask and its block sizes, device.
  const KernelRequirements &requirements() const;
  int device() const;

  const AttentionVariant &variant() const;
  // Schedule, arch, tunables (and whether they came from the caller, the tuning database or the schedule's
  // defaults) and every kernel with where it came from (aot/memory/disk/built) and its compile time.
  std::string describe() const;
  // Kernel launches of one RunPhase::all call at most (the prologue's and the attention kernel; a prologue that only
  // copies Q and K is skipped for tensors already in the workspace's layout).
  size_t launchCount() const;

private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace sage::runtime
