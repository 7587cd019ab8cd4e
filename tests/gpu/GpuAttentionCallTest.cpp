// Validated calls (AttentionRunner::run(AttentionCall)) on the GPU: batch > 1 with GQA, causal masks aligned
// bottom-right (against the CPU reference) and top-left (against exact attention with that mask), with q longer
// and shorter than kv; refused calls leave every output untouched and bad launches name the argument; runners bound to
// a device launch in its context whatever the calling thread has current; repeated calls with other tensors and
// workspaces read their own (the kept sm90 tensor maps); a workspace overlapping an input is refused.
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

using namespace sage;
using namespace sage::reference;

namespace {

const runtime::CudaDriver &driver() { return runtime::CudaDriver::instance(); }

struct DeviceBuffer {
  runtime::driver::DevicePointer pointer = 0;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t size, unsigned char fill = 0xff) : bytes(size) {
    pointer = driver().allocate(bytes);
    driver().fillBytes(pointer, fill, bytes);
  }
  ~DeviceBuffer() { driver().free(pointer); }
  void *get() const { return reinterpret_cast<void *>(pointer); }
  std::vector<unsigned char> read() const {
    std::vector<unsigned char> host(bytes);
    driver().copyToHost(host.data(), pointer, bytes);
    return host;
  }
};

std::vector<uint16_t> bitsOf(const HostTensor &tensor) {
  std::vector<uint16_t> bits(tensor.values().size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = numerics::floatToHalfBits(tensor.values()[i]);
  return bits;
}

// An f16 HND tensor on the device, described as a caller would.
struct DeviceTensor {
  DeviceBuffer buffer;
  runtime::TensorDescription description;
  DeviceTensor(int64_t b, int64_t h, int64_t n, int64_t d, const std::vector<uint16_t> *bits = nullptr)
      : buffer(static_cast<size_t>(b * h * n * d) * 2) {
    if (bits)
      driver().copyToDevice(buffer.pointer, bits->data(), buffer.bytes);
    description.data = buffer.get();
    description.rank = 4;
    description.shape = {b, h, n, d};
    description.strides = {h * n * d, n * d, d, 1};
    description.dtype = runtime::DataType::f16;
    description.device = 0;
  }
};

// Exact attention in double with a top-left causal mask (key j visible to query i iff j <= i).
std::vector<double> exactTopLeft(const HostTensor &q, const HostTensor &k, const HostTensor &v) {
  const int64_t b = q.batch(), h = q.heads(), n_q = q.tokens(), n_kv = k.tokens(), d = q.dim();
  const int64_t group = h / k.heads();
  std::vector<double> out(static_cast<size_t>(b * h * n_q * d));
  std::vector<double> scores(static_cast<size_t>(n_kv));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t i = 0; i < n_q; ++i) {
        const int64_t visible = std::min(n_kv, i + 1);
        double max_score = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j < visible; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d; ++c)
            s += double(q.at(bi, hi, i, c)) * k.at(bi, hi / group, j, c);
          scores[j] = s / std::sqrt(double(d));
          max_score = std::max(max_score, scores[j]);
        }
        for (int64_t j = 0; j < visible; ++j)
          sum += scores[j] = std::exp(scores[j] - max_score);
        for (int64_t c = 0; c < d; ++c) {
          double o = 0.0;
          for (int64_t j = 0; j < visible; ++j)
            o += scores[j] * v.at(bi, hi / group, j, c);
          out[static_cast<size_t>(((bi * h + hi) * n_q + i) * d + c)] = o / sum;
        }
      }
  return out;
}

struct CausalCase {
  int64_t batch, heads_q, heads_kv, tokens_q, tokens_kv;
  runtime::CausalAlignment alignment;
  unsigned char workspace_fill = 0;
  // The calls made on the one workspace, in order; the output is that of the last (each call computes it anew).
  std::vector<std::vector<runtime::RunPhase>> calls = {{runtime::RunPhase::all}};
};

AccuracyMetrics runCausal(const CausalCase &c) {
  constexpr int64_t d = 128;
  ir::Program program = dsl::preset("sage-b", d, MaskKind::causal)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  options.device = 0;
  runtime::AttentionRunner runner(program.variant(), options);
  runtime::CudaDriver::instance().ensureContext(); // the runner left the thread's (empty) context as it was
  const HostTensor q = randomTensor(c.batch, c.heads_q, c.tokens_q, d, StorageType::f16, Layout::hnd, {11});
  const HostTensor k = randomTensor(c.batch, c.heads_kv, c.tokens_kv, d, StorageType::f16, Layout::hnd, {12});
  const HostTensor v = randomTensor(c.batch, c.heads_kv, c.tokens_kv, d, StorageType::f16, Layout::hnd, {13});
  const std::vector<uint16_t> q_bits = bitsOf(q), k_bits = bitsOf(k), v_bits = bitsOf(v);
  DeviceTensor q_device(c.batch, c.heads_q, c.tokens_q, d, &q_bits),
      k_device(c.batch, c.heads_kv, c.tokens_kv, d, &k_bits), v_device(c.batch, c.heads_kv, c.tokens_kv, d, &v_bits),
      o_device(c.batch, c.heads_q, c.tokens_q, d);
  runtime::AttentionCall call;
  call.q = q_device.description;
  call.k = k_device.description;
  call.v = v_device.description;
  call.o = o_device.description;
  call.causal_alignment = c.alignment;
  DeviceBuffer workspace(runner.workspaceBytes(call), c.workspace_fill);
  for (const std::vector<runtime::RunPhase> &phases : c.calls) {
    driver().fillBytes(o_device.buffer.pointer, 0xff, o_device.buffer.bytes); // NaN where nothing is written
    for (runtime::RunPhase phase : phases)
      runner.run(call, workspace.get(), workspace.bytes, nullptr, phase);
  }
  driver().synchronizeContext();

  std::vector<uint16_t> o_bits(o_device.buffer.bytes / 2);
  driver().copyToHost(o_bits.data(), o_device.buffer.pointer, o_device.buffer.bytes);
  std::vector<double> output(o_bits.size());
  for (size_t i = 0; i < o_bits.size(); ++i)
    output[i] = numerics::halfBitsToFloat(o_bits[i]);
  const std::vector<double> expected = c.alignment == runtime::CausalAlignment::top_left
                                           ? exactTopLeft(q, k, v)
                                           : runReference(program.variant(), q, k, v).output;
  const AccuracyMetrics metrics = compareOutputs(expected, output);
  std::printf("gpu_attention_call_test: causal %-12s b%lld h%lld/%lld n%lld/%lld | cos %.6f rel-L1 %.4f\n",
              runtime::nameOf(c.alignment).data(), static_cast<long long>(c.batch), static_cast<long long>(c.heads_q),
              static_cast<long long>(c.heads_kv), static_cast<long long>(c.tokens_q),
              static_cast<long long>(c.tokens_kv), metrics.cosine_similarity, metrics.relative_l1);
  return metrics;
}

} // namespace

TEST_CASE("causal, bottom-right: batch > 1, GQA, q shorter than kv, against the CPU reference") {
  const AccuracyMetrics metrics = runCausal({3, 4, 2, 130, 390, runtime::CausalAlignment::bottom_right});
  CHECK(metrics.relative_l1 <= 0.01);
  CHECK(metrics.cosine_similarity >= 0.999);
}

TEST_CASE("causal, top-left: q shorter and longer than kv, against exact attention with that mask") {
  for (const CausalCase &c : {CausalCase{2, 4, 2, 130, 390, runtime::CausalAlignment::top_left},
                              CausalCase{2, 4, 4, 390, 130, runtime::CausalAlignment::top_left}}) {
    const AccuracyMetrics metrics = runCausal(c);
    CHECK(metrics.relative_l1 <= 0.03); // sage-b's own quantization error against exact attention
    CHECK(metrics.cosine_similarity >= 0.999);
  }
}

TEST_CASE("whole and split calls on a workspace of stale bytes: the persistent kernel's tile counter starts at zero") {
  // On sm_90a sage-b's persistent CTAs claim tiles from a counter in the workspace: a whole call's prologue clears
  // it, split phases get a memset before the attention kernel. A counter left at 0xffffffff (or at the previous
  // call's count) would hand out no tiles, and the output would keep its NaN fill.
  using runtime::RunPhase;
  CausalCase c{2, 4, 2, 300, 300, runtime::CausalAlignment::bottom_right, 0xff};
  c.calls = {{RunPhase::all},
             {RunPhase::all},
             {RunPhase::prologue, RunPhase::attention},
             {RunPhase::attention},
             {RunPhase::all}};
  const AccuracyMetrics metrics = runCausal(c);
  CHECK(metrics.relative_l1 <= 0.01);
  CHECK(metrics.cosine_similarity >= 0.999);
}

TEST_CASE("refused calls launch nothing: the output keeps its fill pattern") {
  ir::Program program = dsl::preset("sage-b", 128)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  runtime::AttentionRunner runner(program.variant(), options);
  DeviceTensor q(2, 2, 128, 128), k(2, 2, 128, 128), v(2, 2, 128, 128), o(2, 2, 128, 128), q64(2, 2, 128, 64);
  runtime::AttentionCall call;
  call.q = q64.description; // d=64 into a d=128 kernel
  call.k = k.description;
  call.v = v.description;
  call.o = o.description;
  DeviceBuffer workspace(1 << 24, 0);
  CHECK_THROWS_AS(runner.run(call, workspace.get(), workspace.bytes, nullptr), runtime::ArgumentError);
  call.q = q.description;
  call.k.dtype = runtime::DataType::bf16; // bf16 read as f16
  CHECK_THROWS_AS(runner.run(call, workspace.get(), workspace.bytes, nullptr), runtime::ArgumentError);
  call.k = k.description;
  call.v.shape[2] = 64; // v disagrees with k
  CHECK_THROWS_AS(runner.run(call, workspace.get(), workspace.bytes, nullptr), runtime::ArgumentError);
  call.v = v.description;
  call.o.device = 1; // another device
  CHECK_THROWS_AS(runner.run(call, workspace.get(), workspace.bytes, nullptr), runtime::ArgumentError);
  driver().synchronizeContext();
  const std::vector<unsigned char> bytes = o.buffer.read();
  CHECK(std::all_of(bytes.begin(), bytes.end(), [](unsigned char byte) { return byte == 0xff; }));
}

TEST_CASE("bad launches name the argument") {
  runtime::AttentionRunner runner(dsl::preset("sage-b", 64)->describe(), {});
  runtime::AttentionTensors tensors;
  CHECK_THROWS_WITH_AS(runner.run({1, 3, 2, 64, 64, 64}, tensors, nullptr, 0, nullptr),
                       doctest::Contains("heads_q (3) must be a multiple of heads_kv (2)"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(runner.run({1, 2, 2, 64, 64, 128}, tensors, nullptr, 0, nullptr),
                       doctest::Contains("head_dim 128 does not match"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(runner.run({1, 2, 2, 64, 64, 64}, tensors, nullptr, 0, nullptr),
                       doctest::Contains("must not be null"), std::invalid_argument);
}

TEST_CASE("a runner bound to a device launches in its context from a thread with none current") {
  ir::Program program = dsl::preset("sage-b", 64)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  options.device = 0;
  runtime::AttentionRunner runner(program.variant(), options);
  CHECK(runner.device() == 0);
  CHECK(runner.requirements().device == 0);
  DeviceTensor q(1, 2, 128, 64), k(1, 2, 128, 64), v(1, 2, 128, 64), o(1, 2, 128, 64);
  // Every element 0x3c3c (1.0586 in f16): uniform attention over equal values gives that value back.
  for (const DeviceTensor *tensor : {&q, &k, &v})
    driver().fillBytes(tensor->buffer.pointer, 0x3c, tensor->buffer.bytes);
  runtime::AttentionCall call;
  call.q = q.description;
  call.k = k.description;
  call.v = v.description;
  call.o = o.description;
  DeviceBuffer workspace(runner.workspaceBytes(call), 0);
  std::thread([&] {
    driver().setCurrentContext(nullptr); // a fresh thread: nothing current
    runner.run(call, workspace.get(), workspace.bytes, nullptr);
    CHECK(driver().currentContext() == nullptr); // the caller's (empty) context is restored
  }).join();
  driver().synchronizeContext();
  std::vector<uint16_t> out(o.buffer.bytes / 2);
  driver().copyToHost(out.data(), o.buffer.pointer, o.buffer.bytes);
  CHECK(std::all_of(out.begin(), out.end(),
                    [](uint16_t bits) { return std::fabs(numerics::halfBitsToFloat(bits) - 1.0586f) < 0.01f; }));
  runtime::AttentionRunnerOptions bad = options;
  bad.device = driver().status().device_count;
  CHECK_THROWS_AS(runtime::AttentionRunner(program.variant(), bad), runtime::ArgumentError);
}

TEST_CASE("repeated calls with other tensors and workspaces: the kept tensor maps follow every change") {
  // The sm90 runner keeps the last tensor map per slot (TensorMapCache) and encodes again only what changed: a call
  // after one with another V, workspace or shape must read its own tensors. Each output is compared with the CPU
  // reference of its own inputs.
  constexpr int64_t d = 128, b = 1, h = 4, n = 256, n_short = 128;
  ir::Program program = dsl::preset("sage-b", d)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  options.device = 0;
  runtime::AttentionRunner runner(program.variant(), options);
  runtime::CudaDriver::instance().ensureContext();
  const HostTensor q = randomTensor(b, h, n, d, StorageType::f16, Layout::hnd, {21});
  const HostTensor q_short = randomTensor(b, h, n_short, d, StorageType::f16, Layout::hnd, {22});
  const HostTensor k = randomTensor(b, h, n, d, StorageType::f16, Layout::hnd, {23});
  const HostTensor v1 = randomTensor(b, h, n, d, StorageType::f16, Layout::hnd, {24});
  const HostTensor v2 = randomTensor(b, h, n, d, StorageType::f16, Layout::hnd, {25});
  const std::vector<uint16_t> q_bits = bitsOf(q), q_short_bits = bitsOf(q_short), k_bits = bitsOf(k),
                              v1_bits = bitsOf(v1), v2_bits = bitsOf(v2);
  DeviceTensor q_device(b, h, n, d, &q_bits), q_short_device(b, h, n_short, d, &q_short_bits),
      k_device(b, h, n, d, &k_bits), v1_device(b, h, n, d, &v1_bits), v2_device(b, h, n, d, &v2_bits),
      o_device(b, h, n, d), o_short_device(b, h, n_short, d);
  runtime::AttentionCall call;
  call.q = q_device.description;
  call.k = k_device.description;
  call.o = o_device.description;
  call.v = v1_device.description;
  const size_t bytes = runner.workspaceBytes(call);
  DeviceBuffer workspace_a(bytes, 0xff), workspace_b(bytes, 0xff);
  struct Step {
    const DeviceTensor *q, *v, *o;
    const DeviceBuffer *workspace;
    const HostTensor *q_host, *v_host;
  };
  const Step steps[] = {{&q_device, &v1_device, &o_device, &workspace_a, &q, &v1},
                        {&q_device, &v1_device, &o_device, &workspace_a, &q, &v1}, // all kept
                        {&q_device, &v2_device, &o_device, &workspace_a, &q, &v2}, // another V
                        {&q_device, &v2_device, &o_device, &workspace_b, &q, &v2}, // another workspace
                        {&q_short_device, &v2_device, &o_short_device, &workspace_b, &q_short, &v2}, // another shape
                        {&q_device, &v1_device, &o_device, &workspace_a, &q, &v1}};
  int index = 0;
  for (const Step &step : steps) {
    call.q = step.q->description;
    call.v = step.v->description;
    call.o = step.o->description;
    driver().fillBytes(step.o->buffer.pointer, 0xff, step.o->buffer.bytes); // NaN where nothing is written
    runner.run(call, step.workspace->get(), step.workspace->bytes, nullptr);
    driver().synchronizeContext();
    std::vector<uint16_t> o_bits(step.o->buffer.bytes / 2);
    driver().copyToHost(o_bits.data(), step.o->buffer.pointer, step.o->buffer.bytes);
    std::vector<double> output(o_bits.size());
    for (size_t i = 0; i < o_bits.size(); ++i)
      output[i] = numerics::halfBitsToFloat(o_bits[i]);
    const AccuracyMetrics metrics =
        compareOutputs(runReference(program.variant(), *step.q_host, k, *step.v_host).output, output);
    INFO("step " << index);
    CHECK(metrics.relative_l1 <= 0.01);
    CHECK(metrics.cosine_similarity >= 0.999);
    ++index;
  }
}

TEST_CASE("a workspace overlapping an input is refused before any launch, naming the workspace") {
  ir::Program program = dsl::preset("sage-b", 64)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  runtime::AttentionRunner runner(program.variant(), options);
  DeviceTensor q(1, 2, 128, 64), k(1, 2, 128, 64), v(1, 2, 128, 64), o(1, 2, 128, 64);
  runtime::AttentionCall call;
  call.q = q.description;
  call.k = k.description;
  call.v = v.description;
  call.o = o.description;
  const size_t bytes = runner.workspaceBytes(call);
  DeviceBuffer big(bytes + q.buffer.bytes, 0);
  call.q.data = big.get(); // q inside the workspace's first bytes
  CHECK_THROWS_WITH_AS(runner.run(call, big.get(), big.bytes, nullptr), doctest::Contains("workspace"),
                       runtime::ArgumentError);
  driver().synchronizeContext();
  const std::vector<unsigned char> out = o.buffer.read();
  CHECK(std::all_of(out.begin(), out.end(), [](unsigned char byte) { return byte == 0xff; }));
}
