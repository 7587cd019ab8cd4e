// Compile on any thread, check and time on the GPU with events.
#include "sage/runtime/GpuCandidateTimer.h"

#include "sage/numerics/Quantizers.h"
#include "sage/reference/HostTensor.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/CudaError.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace sage::runtime {
namespace {

using reference::HostTensor;

// A device allocation freed on destruction.
struct DeviceBuffer {
  driver::DevicePointer pointer = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t size) : bytes(size) {
    pointer = CudaDriver::instance().allocate(std::max<size_t>(size, 256));
  }
  ~DeviceBuffer() { CudaDriver::instance().free(pointer); }
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  void *get() const { return reinterpret_cast<void *>(pointer); }
};

// Timed with events, destroyed on every path.
struct EventPair {
  const CudaDriver &driver = CudaDriver::instance();
  driver::Event start = driver.createEvent(), end = driver.createEvent();
  ~EventPair() {
    driver.destroyEvent(start);
    driver.destroyEvent(end);
  }
};

SageTensorStrides contiguousHnd(const schedules::ProblemShape &shape, int64_t heads) {
  return {heads * shape.tokens_q * shape.head_dim, shape.tokens_q * shape.head_dim, shape.head_dim};
}

uint16_t toBits(float value, schedules::InputType input) {
  return input == schedules::InputType::bf16 ? numerics::floatToBfloat16Bits(value) : numerics::floatToHalfBits(value);
}

float fromBits(uint16_t bits, schedules::InputType input) {
  return input == schedules::InputType::bf16 ? numerics::bfloat16BitsToFloat(bits) : numerics::halfBitsToFloat(bits);
}

std::vector<uint16_t> bitsOf(const HostTensor &tensor, schedules::InputType input) {
  std::vector<uint16_t> bits(tensor.values().size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = toBits(tensor.values()[i], input);
  return bits;
}

// Roughly N(0,1) values (a sum of four uniforms) from a fixed xorshift: the timed data only has to look like
// activations, and 100 million of them must be quick to make.
std::vector<uint16_t> benchData(size_t count, uint64_t seed, schedules::InputType input) {
  std::vector<uint16_t> bits(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<float>(state >> 40) / static_cast<float>(1u << 24);
  };
  for (uint16_t &value : bits)
    value = toBits((next() + next() + next() + next() - 2.0f) * 1.7320508f, input);
  return bits;
}

} // namespace

// Q, K, V, O and the workspace of one problem, in HND layout.
struct GpuCandidateTimer::Buffers {
  schedules::ProblemShape shape;
  DeviceBuffer q, k, v, o, workspace;
  AttentionTensors tensors;
  Buffers(const schedules::ProblemShape &problem, size_t workspace_bytes)
      : shape(problem), q(bytes(problem, problem.heads_q)), k(bytes(problem, problem.heads_kv)),
        v(bytes(problem, problem.heads_kv)), o(bytes(problem, problem.heads_q)), workspace(workspace_bytes) {
    tensors.q = q.get();
    tensors.k = k.get();
    tensors.v = v.get();
    tensors.o = o.get();
    tensors.q_strides = tensors.o_strides = contiguousHnd(problem, problem.heads_q);
    tensors.k_strides = tensors.v_strides = contiguousHnd(problem, problem.heads_kv);
  }
  static size_t bytes(const schedules::ProblemShape &shape, int64_t heads) {
    return static_cast<size_t>(shape.batch * heads * shape.tokens_q * shape.head_dim) * 2;
  }
  void run(const AttentionRunner &runner) const {
    runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
  }
};

GpuCandidateTimer::GpuCandidateTimer(const AttentionVariant &variant, AttentionRunnerOptions base,
                                     GpuTimingOptions timing)
    : variant_(variant), base_(std::move(base)), timing_(timing) {
  if (!base_.arch)
    throw std::invalid_argument("GpuCandidateTimer: the base options must name the arch");
  const CudaDriver &driver = CudaDriver::instance();
  if (!driver.available())
    throw CudaError("cuInit", 0, "no CUDA driver or device: " + driver.status().reason);
  driver.ensureContext();
  for (schedules::ProblemShape *shape : {&timing_.bench, &timing_.check}) {
    shape->head_dim = variant.head_dim;
    if (shape->tokens_kv != shape->tokens_q)
      throw std::invalid_argument("GpuCandidateTimer: the timed and checked problems are self-attention (n_q = n_kv)");
  }
  const schedules::ProblemShape &check = timing_.check;
  const auto storage =
      base_.input == schedules::InputType::bf16 ? reference::StorageType::bf16 : reference::StorageType::f16;
  const HostTensor q = reference::randomTensor(check.batch, check.heads_q, check.tokens_q, check.head_dim, storage,
                                               reference::Layout::hnd, {11});
  const HostTensor k = reference::randomTensor(check.batch, check.heads_kv, check.tokens_kv, check.head_dim, storage,
                                               reference::Layout::hnd, {12, 0.0, 1.0, 4.0});
  const HostTensor v = reference::randomTensor(check.batch, check.heads_kv, check.tokens_kv, check.head_dim, storage,
                                               reference::Layout::hnd, {13});
  reference_output_ = reference::runReference(variant, q, k, v).output;
  check_inputs_[0] = bitsOf(q, base_.input);
  check_inputs_[1] = bitsOf(k, base_.input);
  check_inputs_[2] = bitsOf(v, base_.input);
}

GpuCandidateTimer::~GpuCandidateTimer() = default;

void GpuCandidateTimer::compile(const schedules::Tunables &tunables) {
  AttentionRunnerOptions options = base_;
  options.tunables = tunables;
  AttentionRunner::compileKernels(variant_, options);
}

const AttentionRunner &GpuCandidateTimer::runner(const schedules::Tunables &tunables) {
  std::unique_ptr<AttentionRunner> &slot = runners_[schedules::tunablesText(tunables)];
  if (!slot) {
    AttentionRunnerOptions options = base_;
    options.tunables = tunables;
    slot = std::make_unique<AttentionRunner>(variant_, options); // the kernels are in the cache already
  }
  return *slot;
}

std::optional<std::string> GpuCandidateTimer::check(const schedules::Tunables &tunables) {
  const AttentionRunner &candidate = runner(tunables);
  const CudaDriver &driver = CudaDriver::instance();
  if (!check_buffers_) {
    check_buffers_ = std::make_unique<Buffers>(timing_.check, candidate.workspaceBytes(timing_.check));
    driver.copyToDevice(check_buffers_->q.pointer, check_inputs_[0].data(), check_buffers_->q.bytes);
    driver.copyToDevice(check_buffers_->k.pointer, check_inputs_[1].data(), check_buffers_->k.bytes);
    driver.copyToDevice(check_buffers_->v.pointer, check_inputs_[2].data(), check_buffers_->v.bytes);
  }
  driver.fillBytes(check_buffers_->o.pointer, 0xff, check_buffers_->o.bytes); // NaNs where nothing is written
  check_buffers_->run(candidate);
  driver.synchronizeContext();
  std::vector<uint16_t> bits(check_buffers_->o.bytes / 2);
  driver.copyToHost(bits.data(), check_buffers_->o.pointer, check_buffers_->o.bytes);
  std::vector<double> output(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    output[i] = fromBits(bits[i], base_.input);

  const reference::AccuracyMetrics to_reference = reference::compareOutputs(reference_output_, output);
  if (default_output_.empty()) { // the default: the baseline of every other candidate
    if (!(to_reference.cosine_similarity >= 0.99))
      return fmt::format("the default configuration disagrees with the CPU reference (cos {:.6f})",
                         to_reference.cosine_similarity);
    default_output_ = std::move(output);
    default_relative_l1_ = to_reference.relative_l1;
    return std::nullopt;
  }
  const reference::AccuracyMetrics to_default = reference::compareOutputs(default_output_, output);
  const double bound = 1.25 * default_relative_l1_ + 0.004;
  if (!(to_reference.relative_l1 <= bound) || !(to_default.cosine_similarity >= 0.999))
    return fmt::format("output differs: rel-L1 {:.4f} to the CPU reference (bound {:.4f}), cos {:.6f} to the default "
                       "(bound 0.999)",
                       to_reference.relative_l1, bound, to_default.cosine_similarity);
  return std::nullopt;
}

double GpuCandidateTimer::time(const schedules::Tunables &tunables) {
  const AttentionRunner &candidate = runner(tunables);
  const CudaDriver &driver = CudaDriver::instance();
  if (!bench_buffers_) {
    bench_buffers_ = std::make_unique<Buffers>(timing_.bench, candidate.workspaceBytes(timing_.bench));
    uint64_t seed = 21;
    for (const DeviceBuffer *buffer : {&bench_buffers_->q, &bench_buffers_->k, &bench_buffers_->v}) {
      const std::vector<uint16_t> data = benchData(buffer->bytes / 2, seed++, base_.input);
      driver.copyToDevice(buffer->pointer, data.data(), buffer->bytes);
    }
  }
  for (int call = 0; call < timing_.warmup_calls; ++call)
    bench_buffers_->run(candidate);
  driver.synchronizeContext();
  EventPair events;
  std::vector<double> milliseconds;
  for (int call = 0; call < std::max(1, timing_.timed_calls); ++call) {
    driver.recordEvent(events.start, nullptr);
    bench_buffers_->run(candidate);
    driver.recordEvent(events.end, nullptr);
    driver.synchronizeEvent(events.end);
    milliseconds.push_back(driver.elapsedMilliseconds(events.start, events.end));
  }
  std::nth_element(milliseconds.begin(), milliseconds.begin() + milliseconds.size() / 2, milliseconds.end());
  runners_.erase(schedules::tunablesText(tunables)); // measured: free its modules' slot in our map
  return milliseconds[milliseconds.size() / 2];
}

} // namespace sage::runtime
