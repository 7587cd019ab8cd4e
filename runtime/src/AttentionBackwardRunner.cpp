#include "sage/runtime/AttentionBackwardRunner.h"

#include "sage/device/sm80/backward_params.cuh"
#include "sage/numerics/CheckedSize.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AuxiliaryKernels.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GeneratedKernelLoader.h"
#include "sage/runtime/ProcessResources.h"

#include <fmt/core.h>

#include <cmath>
#include <limits>

namespace sage::runtime {
namespace {

constexpr int64_t kAlignment = 256;

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// The workspace parts in SageBackwardParams' order: q_codes, q_codes_t, k_codes, k_codes_t, do_codes_t, q_scales,
// k_scales, do_scales, row_stats, dq_accum, do_tiles (empty unless the plan has bulk tiles), k_sums (empty unless K
// is smoothed).
std::vector<int64_t> partBytes(const schedules::BackwardWorkspaceSizes &sizes) {
  return {sizes.q_codes,  sizes.q_codes,   sizes.k_codes,   sizes.k_codes,  sizes.do_codes, sizes.q_scales,
          sizes.k_scales, sizes.do_scales, sizes.row_stats, sizes.dq_accum, sizes.do_tiles, sizes.k_sums};
}

void checkShape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q, int64_t tokens_kv, int head_dim) {
  for (auto [name, value] : {std::pair{"batch", batch}, std::pair{"heads_q", heads_q}, std::pair{"heads_kv", heads_kv},
                             std::pair{"tokens_q", tokens_q}, std::pair{"tokens_kv", tokens_kv}})
    if (value <= 0 || value > std::numeric_limits<int>::max())
      throw ArgumentError(name, "must lie in [1, 2^31 - 1], got " + std::to_string(value));
  if (heads_q % heads_kv != 0)
    throw ArgumentError("heads_q", "must be a multiple of heads_kv (" + std::to_string(heads_kv) + "), got " +
                                       std::to_string(heads_q));
  if (!numerics::checkedProduct({batch, heads_q, tokens_q + 63, head_dim, 4}) ||
      !numerics::checkedProduct({batch, heads_kv, tokens_kv + 63, head_dim, 4}))
    throw ArgumentError("tokens_q", "the backward's workspace for this shape overflows 64 bits");
  if (batch > 65535 || heads_q > 65535)
    throw ArgumentError("batch/heads_q", "the launch grid takes at most 65535 of each");
}

} // namespace

AttentionBackwardRunner::AttentionBackwardRunner(const BackwardVariant &variant, schedules::InputType input, int device,
                                                 BackwardRunnerOptions options)
    : variant_(variant), device_(device) {
  const CudaDriver &driver = CudaDriver::instance();
  context_ = driver.primaryContext(device);
  ScopedContext scope(driver, context_);
  const BackwardKernelSet set = generateBackwardKernels(variant, input, currentDeviceArch(), options.ir_fingerprint);
  plan_ = set.plan;
  kernel_name_ = set.kernel.name;
  const std::shared_ptr<const AotKernelDirectory> aot = aotDirectoryFor(options.aot_directory);
  const LoadedGeneratedKernel loaded =
      loadGeneratedKernel(set.kernel, options.cache ? *options.cache : processKernelCache(), aot.get());
  kernel_source_ = loaded.source;
  kernel_digest_ = set.kernel.key.digest();
  compile_milliseconds_ = loaded.compile_milliseconds;
  const std::shared_ptr<const LoadedModule> &module = loaded.module;
  for (const schedules::BackwardLaunch &launch : plan_.launches) {
    kernels_.push_back(module->kernel(launch.entry_point));
    if (launch.dynamic_shared_bytes > 48 * 1024)
      kernels_.back().setMaxDynamicSharedMemory(launch.dynamic_shared_bytes);
  }
}

AttentionBackwardRunner::~AttentionBackwardRunner() = default;

size_t AttentionBackwardRunner::workspaceBytes(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q,
                                               int64_t tokens_kv) const {
  checkShape(batch, heads_q, heads_kv, tokens_q, tokens_kv, plan_.head_dim);
  int64_t total = 0;
  for (int64_t bytes :
       partBytes(schedules::backwardWorkspaceSizes(plan_, batch, heads_q, heads_kv, tokens_q, tokens_kv)))
    total += aligned(bytes);
  return static_cast<size_t>(total);
}

void AttentionBackwardRunner::run(const BackwardTensors &tensors, void *workspace, size_t workspace_bytes,
                                  driver::Stream stream) const {
  const size_t needed =
      workspaceBytes(tensors.batch, tensors.heads_q, tensors.heads_kv, tensors.tokens_q, tensors.tokens_kv);
  if (!workspace || workspace_bytes < needed)
    throw ArgumentError("workspace", "needs " + std::to_string(needed) + " bytes, got " +
                                         std::to_string(workspace ? workspace_bytes : 0));
  if (reinterpret_cast<uintptr_t>(workspace) % kAlignment != 0)
    throw ArgumentError("workspace", "must be 256-byte aligned");
  SageBackwardParams params{};
  params.q = tensors.q;
  params.k = tensors.k;
  params.v = tensors.v;
  params.o = tensors.o;
  params.d_o = tensors.d_o;
  params.lse = tensors.lse;
  params.d_q = tensors.d_q;
  params.d_k = tensors.d_k;
  params.d_v = tensors.d_v;
  auto *cursor = static_cast<unsigned char *>(workspace);
  const std::vector<int64_t> parts = partBytes(schedules::backwardWorkspaceSizes(
      plan_, tensors.batch, tensors.heads_q, tensors.heads_kv, tensors.tokens_q, tensors.tokens_kv));
  std::vector<void *> pointers;
  for (int64_t bytes : parts) {
    pointers.push_back(cursor);
    cursor += aligned(bytes);
  }
  params.q_codes = static_cast<signed char *>(pointers[0]);
  params.q_codes_t = static_cast<signed char *>(pointers[1]);
  params.k_codes = static_cast<signed char *>(pointers[2]);
  params.k_codes_t = static_cast<signed char *>(pointers[3]);
  params.do_codes_t = static_cast<signed char *>(pointers[4]);
  params.q_scales = static_cast<float *>(pointers[5]);
  params.k_scales = static_cast<float *>(pointers[6]);
  params.do_scales = static_cast<float *>(pointers[7]);
  params.row_stats = static_cast<float *>(pointers[8]);
  params.dq_accum = static_cast<float *>(pointers[9]);
  params.do_tiles = parts[10] > 0 ? static_cast<unsigned short *>(pointers[10]) : nullptr;
  params.k_sums = parts[11] > 0 ? static_cast<float *>(pointers[11]) : nullptr;
  params.batch = static_cast<int>(tensors.batch);
  params.heads_q = static_cast<int>(tensors.heads_q);
  params.heads_kv = static_cast<int>(tensors.heads_kv);
  params.tokens_q = static_cast<int>(tensors.tokens_q);
  params.tokens_kv = static_cast<int>(tensors.tokens_kv);
  params.softmax_scale = tensors.softmax_scale > 0.0f
                             ? tensors.softmax_scale
                             : static_cast<float>(1.0 / std::sqrt(static_cast<double>(plan_.head_dim)));

  const CudaDriver &driver = CudaDriver::instance();
  ScopedContext scope(driver, context_);
  for (size_t i = 0; i < kernels_.size(); ++i) {
    const schedules::BackwardLaunch &launch = plan_.launches[i];
    const auto grid =
        launch.gridFor(tensors.batch, tensors.heads_q, tensors.heads_kv, tensors.tokens_q, tensors.tokens_kv);
    kernels_[i].launch(params, {{unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2])},
                                {unsigned(launch.threads), 1u, 1u},
                                unsigned(launch.dynamic_shared_bytes),
                                stream});
  }
}

std::string AttentionBackwardRunner::describe() const {
  return fmt::format("backward '{}': {}, kernels {} [{}{}]", variant_.name, plan_.describe(), kernel_name_,
                     cacheSourceName(kernel_source_),
                     kernel_source_ == CacheSource::built ? fmt::format(" {:.0f} ms", compile_milliseconds_)
                                                          : std::string());
}

} // namespace sage::runtime
