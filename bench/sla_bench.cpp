// SLA on the GPU for a sparsity curve: for each sparsity s, k_h = 100 - s (the critical blocks computed exactly) and
// k_l = min(10, s)%; times the whole forward, the mask prediction alone (RunPhase::prologue), the sparse part alone
// (the block-sparse attention with the predicted mask) and the backward (Algorithm 2, from dO^s and dO^l; with the
// forward's O^s passed, and without: backward_recomputed_statistics_ms, the statistics kernel's way). Prints one
// JSON object per line; bench/sla_bench.py runs it and compares with dense cuDNN SDPA in the same run.
//
//   sla_bench --preset sla-f16 --dim 128 --tokens 32768 --batch 1 --heads 16 --sparsities 50,75,90,95,97 [--input bf16]
#include "sage/dsl/Presets.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/SlaRunner.h"
#include "sage/schedules/InputType.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;

namespace {

struct Options {
  std::string preset = "sla-f16";
  int dim = 128;
  long long tokens = 32768, batch = 1, heads = 16;
  std::vector<double> sparsities = {50, 60, 70, 80, 85, 90, 95, 97};
  int repeats = 20;
  schedules::InputType input = schedules::InputType::f16; // of Q, K, V and O
};

std::vector<double> parseList(const std::string &text) {
  std::vector<double> values;
  std::stringstream stream(text);
  for (std::string item; std::getline(stream, item, ',');)
    values.push_back(std::stod(item));
  return values;
}

Options parse(int argc, char **argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--preset")
      options.preset = value;
    else if (flag == "--dim")
      options.dim = std::stoi(value);
    else if (flag == "--tokens")
      options.tokens = std::stoll(value);
    else if (flag == "--batch")
      options.batch = std::stoll(value);
    else if (flag == "--heads")
      options.heads = std::stoll(value);
    else if (flag == "--sparsities")
      options.sparsities = parseList(value);
    else if (flag == "--repeats")
      options.repeats = std::stoi(value);
    else if (flag == "--input") {
      const std::optional<schedules::InputType> input = schedules::parseInputType(value);
      if (!input)
        throw std::invalid_argument("--input: expected f16 or bf16, got '" + value + "'");
      options.input = *input;
    } else
      throw std::invalid_argument("unknown flag " + flag);
  }
  return options;
}

// Median milliseconds of `repeats` calls after 3 warm-up calls, timed with events on the default stream.
double medianMilliseconds(const std::function<void()> &call, int repeats) {
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  for (int i = 0; i < 3; ++i)
    call();
  driver.synchronizeContext();
  std::vector<double> samples;
  const runtime::driver::Event start = driver.createEvent(), end = driver.createEvent();
  for (int i = 0; i < repeats; ++i) {
    driver.recordEvent(start, nullptr);
    call();
    driver.recordEvent(end, nullptr);
    driver.synchronizeEvent(end);
    samples.push_back(driver.elapsedMilliseconds(start, end));
  }
  driver.destroyEvent(start);
  driver.destroyEvent(end);
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

} // namespace

int main(int argc, char **argv) {
  try {
    const Options options = parse(argc, argv);
    const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
    driver.ensureContext();
    const long long elements = options.batch * options.heads * options.tokens * options.dim;
    // Random-ish inputs (a fixed pattern of small values: timing does not depend on them).
    const bool bf16 = options.input == schedules::InputType::bf16;
    std::vector<unsigned short> bits(static_cast<size_t>(elements));
    unsigned state = 12345u;
    for (unsigned short &value : bits) {
      state = state * 1664525u + 1013904223u;
      // f16 or bf16 in [0.125, 0.25), sign from bit 0
      value = static_cast<unsigned short>(bf16 ? 0x3E00u + (state >> 25) : 0x3000u + (state >> 22));
      if (state & 1u)
        value |= 0x8000u;
    }
    const size_t tensor_bytes = bits.size() * 2;
    runtime::driver::DevicePointer q = driver.allocate(tensor_bytes), k = driver.allocate(tensor_bytes),
                                   v = driver.allocate(tensor_bytes), o = driver.allocate(tensor_bytes);
    for (runtime::driver::DevicePointer pointer : {q, k, v})
      driver.copyToDevice(pointer, bits.data(), tensor_bytes);
    std::vector<float> weight(static_cast<size_t>(options.dim * options.dim), 0.0f);
    for (int c = 0; c < options.dim; ++c)
      weight[static_cast<size_t>(c * options.dim + c)] = 1.0f;
    const runtime::driver::DevicePointer proj = driver.allocate(weight.size() * 4);
    driver.copyToDevice(proj, weight.data(), weight.size() * 4);
    // The backward's f32 dO^s, dO^l (a constant pattern) and dQ, dK, dV.
    const size_t gradient_bytes = bits.size() * 4;
    const std::vector<float> ones(bits.size(), 0.01f);
    runtime::driver::DevicePointer d_sparse = driver.allocate(gradient_bytes),
                                   d_linear = driver.allocate(gradient_bytes), dq = driver.allocate(gradient_bytes),
                                   dk = driver.allocate(gradient_bytes), dv = driver.allocate(gradient_bytes);
    driver.copyToDevice(d_sparse, ones.data(), gradient_bytes);
    driver.copyToDevice(d_linear, ones.data(), gradient_bytes);

    const SageTensorStrides strides{options.heads * options.tokens * options.dim, options.tokens * options.dim,
                                    options.dim};
    const schedules::ProblemShape shape{options.batch,  options.heads,  options.heads,
                                        options.tokens, options.tokens, options.dim};
    for (double sparsity : options.sparsities) {
      const double critical = 100.0 - sparsity, negligible = std::min(10.0, sparsity);
      const AttentionVariant base = dsl::preset(options.preset, options.dim)->describe();
      AttentionVariant variant = base;
      variant.sla.critical_percent = critical;
      variant.sla.negligible_percent = negligible;
      runtime::AttentionRunnerOptions runner_options;
      runner_options.tokens_hint = options.tokens;
      runner_options.input = options.input;
      const runtime::SlaRunner runner(variant, runner_options);
      const runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(shape, true); // forward offsets, + backward
      const runtime::driver::DevicePointer workspace = driver.allocate(layout.total);
      runtime::SlaTensors tensors;
      tensors.q = reinterpret_cast<const void *>(q);
      tensors.k = reinterpret_cast<const void *>(k);
      tensors.v = reinterpret_cast<const void *>(v);
      tensors.q_strides = tensors.k_strides = tensors.v_strides = tensors.o_strides = strides;
      tensors.o = reinterpret_cast<void *>(o);
      tensors.proj_weight = reinterpret_cast<const float *>(proj);
      void *workspace_pointer = reinterpret_cast<void *>(workspace);
      const double forward = medianMilliseconds(
          [&] { runner.run(shape, tensors, workspace_pointer, layout.total, nullptr); }, options.repeats);
      const double prediction = medianMilliseconds(
          [&] { runner.run(shape, tensors, workspace_pointer, layout.total, nullptr, runtime::RunPhase::prologue); },
          options.repeats);
      runtime::AttentionTensors attention;
      attention.q = tensors.q;
      attention.k = tensors.k;
      attention.v = tensors.v;
      attention.q_strides = attention.k_strides = attention.v_strides = attention.o_strides = strides;
      attention.o = tensors.o;
      attention.block_mask = static_cast<unsigned char *>(workspace_pointer) + layout.critical_mask;
      const double sparse = medianMilliseconds(
          [&] {
            runner.sparsePart().run(shape, attention,
                                    static_cast<unsigned char *>(workspace_pointer) + layout.attention,
                                    layout.total - layout.attention, nullptr);
          },
          options.repeats);
      runtime::SlaBackwardTensors gradients;
      gradients.q = tensors.q;
      gradients.k = tensors.k;
      gradients.v = tensors.v;
      gradients.q_strides = gradients.k_strides = gradients.v_strides = strides;
      gradients.d_sparse = reinterpret_cast<const float *>(d_sparse);
      gradients.d_linear = reinterpret_cast<const float *>(d_linear);
      gradients.dq = reinterpret_cast<float *>(dq);
      gradients.dk = reinterpret_cast<float *>(dk);
      gradients.dv = reinterpret_cast<float *>(dv);
      // The classes and states it reads, and O^s with the sparse part's L saved (Proj left to the caller, as the
      // PyTorch module does): the backward forms D^s from O^s where the sparse part is exact.
      tensors.proj_weight = nullptr;
      runner.run(shape, tensors, workspace_pointer, layout.total, nullptr);
      gradients.o_sparse = tensors.o;
      gradients.o_sparse_strides = strides;
      const double backward =
          medianMilliseconds([&] { runner.backward(shape, gradients, workspace_pointer, layout.total, nullptr); },
                             std::max(3, options.repeats / 4));
      gradients.o_sparse = nullptr; // the statistics kernel recomputes L and D^s
      const double backward_recomputed =
          medianMilliseconds([&] { runner.backward(shape, gradients, workspace_pointer, layout.total, nullptr); },
                             std::max(3, options.repeats / 4));
      std::printf(
          "{\"preset\": \"%s\", \"input\": \"%s\", \"dim\": %d, \"tokens\": %lld, \"batch\": %lld, \"heads\": %lld, "
          "\"sparsity\": %.1f, \"critical_percent\": %.1f, \"negligible_percent\": %.1f, "
          "\"critical_blocks_per_row\": %d, \"kv_blocks\": %d, \"pre_aggregation\": %s, "
          "\"forward_ms\": %.4f, \"mask_prediction_ms\": %.4f, \"sparse_part_ms\": %.4f, \"backward_ms\": %.4f, "
          "\"backward_recomputed_statistics_ms\": %.4f, \"workspace_mib\": %.1f}\n",
          options.preset.c_str(), std::string(schedules::nameOf(options.input)).c_str(), options.dim, options.tokens,
          options.batch, options.heads, sparsity, critical, negligible, layout.shape.critical_per_row,
          layout.shape.kv_blocks, layout.marginal_majority ? "true" : "false", forward, prediction, sparse, backward,
          backward_recomputed, static_cast<double>(layout.total) / (1 << 20));
      std::fflush(stdout);
      driver.free(workspace);
    }
    for (runtime::driver::DevicePointer pointer : {q, k, v, o, proj, d_sparse, d_linear, dq, dk, dv})
      driver.free(pointer);
    return 0;
  } catch (const std::exception &error) {
    std::fprintf(stderr, "sla_bench: %s\n", error.what());
    return 1;
  }
}
