// Packed (variable-length) batches on the GPU (issue 28): each sequence's rows of O and the LSE against the CPU
// reference of the dense variant run on that sequence alone (the definition of a packed call), with lengths that
// include 0 and 1, maxima above every length, GQA, a per-sequence K channel offset and Q outlier channels. Rows of Q
// past the last sequence belong to none: their O rows and LSE entries must keep the sentinel written before the call.
// The kernels of `sagegen emit --packed` are what a packed call loads from an AOT directory, and only a packed call.
// Skipped, with a message, where no GPU is present.
#include "../support/RuntimeArguments.h"
#include "../support/SkipWithoutGpu.h"
#include "GpuAttentionRun.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Reference.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/runtime/VarlenCall.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

using namespace sage;
using namespace sage::reference;
using namespace sage::test;

namespace {

struct Case {
  const char *preset;
  int head_dim;
  bool causal;
  StorageType storage;
  int64_t heads_q, heads_kv;
  double max_rel_l1; // vs the reference of the same variant: the dense GPU test's bounds (GpuAttentionTest.cpp)
  double min_cosine;
  double max_lse_error;
};

// Sequence lengths: 0 and 1 included; sequence 3 has queries but no keys (O = 0, LSE = -inf), sequence 1 keys but no
// queries (nothing written). The maxima exceed every length.
const std::vector<int64_t> kLengthsQ = {1, 0, 77, 128, 300, 1000};
const std::vector<int64_t> kLengthsKv = {64, 40, 77, 0, 250, 1000};
constexpr int64_t kMaxQ = 1100, kMaxKv = 1200;
constexpr int64_t kTailRows = 16; // rows of q after the last sequence: in no sequence

std::vector<int> cumulative(const std::vector<int64_t> &lengths) {
  std::vector<int> offsets{0};
  for (int64_t length : lengths)
    offsets.push_back(offsets.back() + static_cast<int>(length));
  return offsets;
}

// A packed [total, heads, d] tensor (HostTensor [1, heads, total, d] stored NHD: the same bytes) whose rows
// cu[b] .. cu[b + 1] - 1 are sequence b's own random tensor (its own seed, so its own channel offsets).
HostTensor packedTensor(const std::vector<int> &cu, int64_t extra_rows, int64_t heads, int64_t dim, StorageType storage,
                        RandomTensorOptions options) {
  const int64_t total = cu.back() + extra_rows;
  HostTensor packed(1, heads, total, dim, storage, Layout::nhd);
  for (size_t b = 0; b + 1 <= cu.size(); ++b) {
    const int64_t begin = cu[b], length = (b + 1 < cu.size() ? cu[b + 1] : total) - begin;
    if (length <= 0)
      continue;
    options.seed += 1;
    const HostTensor part = randomTensor(1, heads, length, dim, storage, Layout::hnd, options);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < length; ++t)
        for (int64_t c = 0; c < dim; ++c)
          packed.set(0, h, begin + t, c, part.at(0, h, t, c));
  }
  return packed;
}

// Rows begin .. begin + length - 1 of a packed tensor as a dense [1, heads, length, d] one.
HostTensor slice(const HostTensor &packed, int64_t begin, int64_t length) {
  HostTensor part(1, packed.heads(), length, packed.dim(), packed.storage(), Layout::hnd);
  for (int64_t h = 0; h < packed.heads(); ++h)
    for (int64_t t = 0; t < length; ++t)
      for (int64_t c = 0; c < packed.dim(); ++c)
        part.set(0, h, t, c, packed.at(0, h, begin + t, c));
  return part;
}

runtime::TensorDescription describe(const void *data, std::initializer_list<int64_t> shape, runtime::DataType dtype) {
  return test::contiguous(shape, reinterpret_cast<uintptr_t>(data), dtype);
}

double decode(uint16_t bits, StorageType storage) {
  return storage == StorageType::bf16 ? numerics::bfloat16BitsToFloat(bits) : numerics::halfBitsToFloat(bits);
}

// The runners' describe(): where each kernel came from ([aot], [built ...], ...).
struct RunnerDescriptions {
  std::string dense;  // the runner the call was made on (its dense kernels, built at construction)
  std::string packed; // its packed runner, which ran the call
};

// With `aot_directory`, the runners look there first.
RunnerDescriptions runCase(const Case &c, const std::filesystem::path &aot_directory = {}) {
  const MaskKind mask = c.causal ? MaskKind::causal : MaskKind::none;
  const ir::Program program = dsl::preset(c.preset, c.head_dim, mask)->lse().build();
  const AttentionVariant variant = program.variant();
  const std::vector<int> cu_q = cumulative(kLengthsQ), cu_kv = cumulative(kLengthsKv);
  const int64_t d = c.head_dim, total_q = cu_q.back() + kTailRows, total_kv = cu_kv.back();
  // Q: 4 outlier channels x 8; K: a large channel offset per sequence (each its own seed).
  const HostTensor q = packedTensor(cu_q, kTailRows, c.heads_q, d, c.storage, {100, 0.0, 1.0, 0.0, 4, 8.0});
  const HostTensor k = packedTensor(cu_kv, 0, c.heads_kv, d, c.storage, {200, 0.0, 1.0, 10.0, 0, 1.0});
  const HostTensor v = packedTensor(cu_kv, 0, c.heads_kv, d, c.storage, {300, 0.0, 1.0, 0.0, 0, 1.0});

  runtime::AttentionRunnerOptions options;
  options.input = c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
  options.ir_fingerprint = program.fingerprint();
  options.aot_directory = aot_directory;
  if (!aot_directory.empty()) // emit's kernels have the schedule's default tunables: no tuned entry may replace them
    options.tuning = std::make_shared<const runtime::TuningDatabase>();
  const runtime::AttentionRunner runner(variant, options);
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  DeviceTensor q_device(q), k_device(k), v_device(v);
  DeviceTensor o_device(static_cast<size_t>(total_q * c.heads_q * d) * 2); // 0xff bytes: the sentinel
  DeviceTensor lse_device(static_cast<size_t>(c.heads_q * total_q) * sizeof(float));
  DeviceTensor cu_q_device(cu_q.size() * sizeof(int)), cu_kv_device(cu_kv.size() * sizeof(int));
  driver.copyToDevice(cu_q_device.pointer, cu_q.data(), cu_q_device.bytes);
  driver.copyToDevice(cu_kv_device.pointer, cu_kv.data(), cu_kv_device.bytes);
  const int64_t batch = static_cast<int64_t>(kLengthsQ.size());
  DeviceTensor workspace(runner.varlenWorkspaceBytes(batch, c.heads_q, c.heads_kv, kMaxQ, kMaxKv));

  const runtime::DataType storage = c.storage == StorageType::bf16 ? runtime::DataType::bf16 : runtime::DataType::f16;
  runtime::VarlenCall call;
  call.q = describe(q_device.get(), {total_q, c.heads_q, d}, storage);
  call.k = describe(k_device.get(), {total_kv, c.heads_kv, d}, storage);
  call.v = describe(v_device.get(), {total_kv, c.heads_kv, d}, storage);
  call.o = describe(o_device.get(), {total_q, c.heads_q, d}, storage);
  call.lse = describe(lse_device.get(), {c.heads_q, total_q}, runtime::DataType::f32);
  call.cu_seqlens_q = describe(cu_q_device.get(), {batch + 1}, runtime::DataType::i32);
  call.cu_seqlens_kv = describe(cu_kv_device.get(), {batch + 1}, runtime::DataType::i32);
  call.max_seqlen_q = kMaxQ;
  call.max_seqlen_kv = kMaxKv;
  call.causal_alignment = runtime::CausalAlignment::bottom_right; // the reference's rule, per sequence
  runner.run(call, workspace.get(), workspace.bytes, nullptr);
  driver.synchronizeContext();

  std::vector<uint16_t> o_bits(static_cast<size_t>(total_q * c.heads_q * d));
  driver.copyToHost(o_bits.data(), o_device.pointer, o_device.bytes);
  std::vector<float> lse(static_cast<size_t>(c.heads_q * total_q));
  driver.copyToHost(lse.data(), lse_device.pointer, lse_device.bytes);
  auto o_at = [&](int64_t row, int64_t h, int64_t ch) {
    return o_bits[static_cast<size_t>((row * c.heads_q + h) * d + ch)];
  };
  auto lse_at = [&](int64_t h, int64_t row) { return lse[static_cast<size_t>(h * total_q + row)]; };

  for (size_t b = 0; b < kLengthsQ.size(); ++b) {
    const int64_t length_q = kLengthsQ[b], length_kv = kLengthsKv[b];
    if (length_q == 0)
      continue;
    if (length_kv == 0) { // no keys: O = 0 and LSE = -inf, as a dense fully masked row
      bool zero = true, minus_infinity = true;
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t t = 0; t < length_q; ++t) {
          minus_infinity = minus_infinity && std::isinf(lse_at(h, cu_q[b] + t)) && lse_at(h, cu_q[b] + t) < 0;
          for (int64_t ch = 0; ch < d; ++ch)
            zero = zero && decode(o_at(cu_q[b] + t, h, ch), c.storage) == 0.0;
        }
      CHECK_MESSAGE(zero, "sequence " << b << ": O must be 0 without keys");
      CHECK_MESSAGE(minus_infinity, "sequence " << b << ": LSE must be -inf without keys");
      continue;
    }
    const AttentionResult expected = runReference(variant, slice(q, cu_q[b], length_q), slice(k, cu_kv[b], length_kv),
                                                  slice(v, cu_kv[b], length_kv));
    std::vector<double> output(expected.output.size());
    double lse_error = 0.0;
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t t = 0; t < length_q; ++t) {
        const size_t row = static_cast<size_t>(h * length_q + t);
        for (int64_t ch = 0; ch < d; ++ch)
          output[row * static_cast<size_t>(d) + static_cast<size_t>(ch)] = decode(o_at(cu_q[b] + t, h, ch), c.storage);
        if (std::isfinite(expected.lse[row]))
          lse_error = std::max(lse_error, std::fabs(lse_at(h, cu_q[b] + t) - expected.lse[row]));
        else
          CHECK(std::isinf(lse_at(h, cu_q[b] + t)));
      }
    const AccuracyMetrics metrics = compareOutputs(expected.output, output);
    std::printf("gpu_varlen_test: %-9s d%-3d %-6s %-4s h%lld/%lld seq %zu n%lld/%lld | cos %.6f rel-L1 %.4f | lse "
                "err %.2e\n",
                c.preset, c.head_dim, c.causal ? "causal" : "full", nameOf(c.storage).data(),
                static_cast<long long>(c.heads_q), static_cast<long long>(c.heads_kv), b,
                static_cast<long long>(length_q), static_cast<long long>(length_kv), metrics.cosine_similarity,
                metrics.relative_l1, lse_error);
    CHECK_MESSAGE(metrics.relative_l1 <= c.max_rel_l1, c.preset << " sequence " << b);
    CHECK_MESSAGE(metrics.cosine_similarity >= c.min_cosine, c.preset << " sequence " << b);
    CHECK_MESSAGE(lse_error <= c.max_lse_error, c.preset << " sequence " << b);
  }
  // Rows in no sequence: untouched (the 0xff sentinel in O and the LSE).
  bool untouched = true;
  for (int64_t row = cu_q.back(); row < total_q; ++row)
    for (int64_t h = 0; h < c.heads_q; ++h) {
      uint32_t lse_bits = 0;
      const float value = lse_at(h, row);
      std::memcpy(&lse_bits, &value, sizeof lse_bits);
      untouched = untouched && lse_bits == 0xffffffffu;
      for (int64_t ch = 0; ch < d; ++ch)
        untouched = untouched && o_at(row, h, ch) == 0xffff;
    }
  CHECK_MESSAGE(untouched, c.preset << ": rows after the last sequence were written");
  return {runner.describe(), runner.packedRunner().describe()};
}

size_t occurrences(const std::string &text, const std::string &word) {
  size_t count = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    ++count;
  return count;
}

// `sagegen emit` of the case's variant (with --lse, as runCase builds it) for this device into `directory`.
void emit(const Case &c, const std::filesystem::path &directory, bool packed) {
  const std::string command =
      std::string("'") + SAGEGEN_CLI + "' emit --preset " + c.preset + " --headdim " + std::to_string(c.head_dim) +
      (c.causal ? " --causal" : "") + " --lse --input " + std::string(nameOf(c.storage)) + " --arch " +
      std::string(schedules::archName(runtime::currentDeviceArch())) + (packed ? " --packed" : "") +
      " --format cubin -o '" + directory.string() + "' >/dev/null";
  std::printf("gpu_varlen_test: %s\n", command.c_str());
  REQUIRE_MESSAGE(std::system(command.c_str()) == 0, command);
}

} // namespace

TEST_CASE("packed sequences match the reference of each sequence alone") {
  if (skipWithoutGpu("gpu_varlen_test"))
    return;
  // The dense GPU test's bounds for these presets (GpuAttentionTest.cpp explains them).
  const Case cases[] = {
      {"sage-b", 128, false, StorageType::f16, 4, 2, 0.01, 0.999, 0.01},
      {"sage-b", 64, true, StorageType::bf16, 4, 1, 0.015, 0.999, 0.01},
      {"sage2-fp8", 128, true, StorageType::f16, 4, 2, 0.04, 0.999, 0.01},
      {"sage2-fp8", 64, false, StorageType::bf16, 2, 2, 0.04, 0.999, 0.01},
      {"sage-vb", 128, true, StorageType::f16, 4, 4, 0.02, 0.999, 0.01},
      {"sage-t", 64, false, StorageType::f16, 2, 1, 0.01, 0.999, 0.01},
  };
  for (const Case &c : cases) {
    CAPTURE(c.preset);
    CAPTURE(c.head_dim);
    runCase(c);
  }
}

TEST_CASE("packed AOT kernels (sagegen emit --packed) serve packed calls, and only packed calls") {
  if (skipWithoutGpu("gpu_varlen_test"))
    return;
  const Case c{"sage-b", 128, true, StorageType::f16, 4, 2, 0.01, 0.999, 0.01};
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("sagegen-gpu-varlen-aot." + std::to_string(::getpid()));
  // $SAGEGEN_TEST_PACKED_AOT_DIR: a directory of `sagegen emit --packed --preset sage-b --headdim 128 --causal --lse
  // --arch <this GPU's> --format cubin`; else this test runs that emit itself.
  const char *given = std::getenv("SAGEGEN_TEST_PACKED_AOT_DIR");
  const std::filesystem::path packed_directory = given && *given ? std::filesystem::path(given) : root / "packed";
  if (!given || !*given)
    emit(c, packed_directory, true);
  emit(c, root / "dense", false);

  const RunnerDescriptions from_packed = runCase(c, packed_directory);
  std::printf("gpu_varlen_test: packed AOT directory: dense runner: %s\n  packed runner: %s\n",
              from_packed.dense.c_str(), from_packed.packed.c_str());
  CHECK(occurrences(from_packed.packed, "[aot]") >= 2); // the prologue's launches and the attention kernel
  CHECK(occurrences(from_packed.packed, "[built") + occurrences(from_packed.packed, "[disk]") +
            occurrences(from_packed.packed, "[memory]") ==
        0);
  CHECK(occurrences(from_packed.dense, "[aot]") == 0); // no packed kernel for the dense runner

  const RunnerDescriptions from_dense = runCase(c, root / "dense");
  std::printf("gpu_varlen_test: dense AOT directory: dense runner: %s\n  packed runner: %s\n", from_dense.dense.c_str(),
              from_dense.packed.c_str());
  CHECK(occurrences(from_dense.dense, "[aot]") >= 2);
  CHECK(occurrences(from_dense.packed, "[aot]") == 0); // no dense kernel for a packed call
  std::error_code ignored;
  std::filesystem::remove_all(root, ignored);
}

TEST_CASE("a dense runner's packed runner is built once and kept") {
  if (skipWithoutGpu("gpu_varlen_test"))
    return;
  const ir::Program program = dsl::preset("sage-b", 128, MaskKind::none)->build();
  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  const runtime::AttentionRunner runner(program.variant(), options);
  const runtime::AttentionRunner &packed = runner.packedRunner();
  CHECK(packed.variant().packed_sequences);
  CHECK(&runner.packedRunner() == &packed);
  CHECK(&packed.packedRunner() == &packed);
  // Its workspace is the dense call's of the maxima.
  CHECK(runner.varlenWorkspaceBytes(3, 8, 8, 500, 700) ==
        runner.workspaceBytes(schedules::ProblemShape{3, 8, 8, 500, 700, 128}));
}
