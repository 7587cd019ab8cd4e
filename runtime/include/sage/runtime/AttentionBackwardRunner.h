// SageBwd (issue 12) at run time: the backward kernels of one BackwardVariant for one device, compiled with NVRTC
// through the kernel cache on construction (an AOT directory's cubin, else memory, then $SAGEGEN_CACHE_DIR, then
// NVRTC, as the forward's) and
// launched on a stream with a caller-provided workspace.
#pragma once

#include "sage/ir/BackwardVariant.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/KernelCache.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/schedules/BackwardSchedule.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace sage::runtime {

// Device pointers of contiguous [batch, heads, tokens, head_dim] tensors (q, o, d_o, d_q: heads_q and tokens_q;
// k, v, d_k, d_v: heads_kv and tokens_kv) in the runner's input type; lse f32 [batch, heads_q, tokens_q] (natural
// log, the forward's). Causal masks are bottom-right aligned (j <= i + tokens_kv - tokens_q).
struct BackwardTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr;
  const float *lse = nullptr;
  void *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;
  int64_t batch = 0, heads_q = 0, heads_kv = 0, tokens_q = 0, tokens_kv = 0;
  float softmax_scale = 0.0f; // 0: 1 / sqrt(head_dim)
};

struct BackwardRunnerOptions {
  std::string ir_fingerprint;   // ir::BackwardProgram::fingerprint(): the IR part of the cache key (may be empty)
  KernelCache *cache = nullptr; // default: the process-wide cache on $SAGEGEN_CACHE_DIR (ProcessResources.h)
  // Ahead-of-time kernels (`sagegen emit --backward` output), looked up before the cache. Empty: $SAGEGEN_AOT_DIR;
  // neither set: none. Only a cubin whose stored key equals the module's key is used.
  std::filesystem::path aot_directory;
};

class AttentionBackwardRunner {
public:
  // Plans (bestBackwardSchedule: std::invalid_argument when nothing supports the variant on the device's arch) and
  // compiles (CompileError) for `device`, or finds the module in the kernel cache.
  AttentionBackwardRunner(const BackwardVariant &variant, schedules::InputType input, int device,
                          BackwardRunnerOptions options = {});
  ~AttentionBackwardRunner();
  AttentionBackwardRunner(const AttentionBackwardRunner &) = delete;
  AttentionBackwardRunner &operator=(const AttentionBackwardRunner &) = delete;

  // Bytes of workspace a run of this shape needs (each part 256-byte aligned). Throws ArgumentError for sizes that
  // are not positive or whose workspace would overflow.
  size_t workspaceBytes(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q, int64_t tokens_kv) const;
  // Launches the plan's kernels on `stream`. Checks sizes (ArgumentError naming the field), not the pointers'
  // memory: the C ABI validates tensor descriptions before calling this.
  void run(const BackwardTensors &tensors, void *workspace, size_t workspace_bytes, driver::Stream stream) const;

  const schedules::BackwardKernelPlan &plan() const { return plan_; }
  // The plan and the module, with where it came from (aot/memory/disk/built, and the compile time when built).
  std::string describe() const;
  CacheSource kernelSource() const { return kernel_source_; }
  const std::string &kernelDigest() const { return kernel_digest_; } // the cache key's digest

private:
  BackwardVariant variant_;
  schedules::BackwardKernelPlan plan_;
  std::string kernel_name_;
  int device_;
  driver::Context context_ = nullptr;
  std::vector<LoadedKernel> kernels_; // plan_.launches' entry points; they keep the module loaded
  CacheSource kernel_source_ = CacheSource::built;
  std::string kernel_digest_;
  double compile_milliseconds_ = 0.0;
};

} // namespace sage::runtime
