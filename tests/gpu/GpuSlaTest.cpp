// SLA's forward on the GPU (issue 13) against the CPU reference: P_c, the block classes, the lookup tables, O^l and
// O, with f16 and bf16 inputs (a runner each); the backward's gradients likewise. The reference runs with the classes
// the GPU predicted (a near-tie may rank differently in f32 than in double; such rows are counted and bounded).
// Skipped, with a message, where no GPU is present. Prints one line per case.
#include "../support/SkipWithoutGpu.h"
#include "NanFilledDeviceBuffer.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Metrics.h"
#include "sage/reference/Sla.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/SlaRunner.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

using namespace sage;
using namespace sage::reference;

namespace {

using DeviceBuffer = test::NanFilledDeviceBuffer;

// The tensor's values in its storage type (f16 or bf16: exact, they are rounded to it already).
std::unique_ptr<DeviceBuffer> upload(const HostTensor &tensor) {
  std::vector<uint16_t> bits(tensor.values().size());
  const bool bf16 = tensor.storage() == StorageType::bf16;
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = bf16 ? numerics::floatToBfloat16Bits(tensor.values()[i]) : numerics::floatToHalfBits(tensor.values()[i]);
  auto buffer = std::make_unique<DeviceBuffer>(bits.size() * 2);
  buffer->driver.copyToDevice(buffer->pointer, bits.data(), buffer->bytes);
  return buffer;
}

std::unique_ptr<DeviceBuffer> upload(const std::vector<double> &values) {
  std::vector<float> floats(values.begin(), values.end());
  auto buffer = std::make_unique<DeviceBuffer>(floats.size() * 4);
  buffer->driver.copyToDevice(buffer->pointer, floats.data(), buffer->bytes);
  return buffer;
}

SageTensorStrides hndStrides(const HostTensor &tensor) {
  return {tensor.heads() * tensor.tokens() * tensor.dim(), tensor.tokens() * tensor.dim(), tensor.dim()};
}

// Proj's d x d weights (then d biases with `bias`) ~ N(0, 1/d) from `generator`, rounded to f32 as the device holds
// them.
Projection randomProjection(int64_t d, std::mt19937_64 &generator, bool bias) {
  Projection projection{d, std::vector<double>(static_cast<size_t>(d * d)),
                        std::vector<double>(bias ? static_cast<size_t>(d) : 0)};
  std::normal_distribution<double> normal(0.0, 1.0 / std::sqrt(static_cast<double>(d)));
  for (double &w : projection.weight)
    w = static_cast<float>(normal(generator));
  for (double &b : projection.bias)
    b = static_cast<float>(normal(generator));
  return projection;
}

// The runner's inputs: q, k, v (HND, on the device at q_device ...) and O in `o`, HND like q.
runtime::SlaTensors hndInputs(const HostTensor &q, const HostTensor &k, const HostTensor &v,
                              const DeviceBuffer &q_device, const DeviceBuffer &k_device, const DeviceBuffer &v_device,
                              void *o) {
  runtime::SlaTensors tensors;
  tensors.q = q_device.get();
  tensors.k = k_device.get();
  tensors.v = v_device.get();
  tensors.q_strides = hndStrides(q);
  tensors.k_strides = hndStrides(k);
  tensors.v_strides = hndStrides(v);
  tensors.o = o;
  tensors.o_strides = hndStrides(q);
  return tensors;
}

// Per-kv-block magnitudes of K and V (so of the states h_j), for the mask GEMM's scaled entries.
enum class BlockMagnitudes {
  uniform, // as drawn
  spread,  // K by 2^-9..2^9, V by 2^-8..2^8 per block: the states' scales span ~34 binades, inside the GEMM's 39
  beyond,  // every fourth block 2^-16 in K and V, the others 2^4 and 2^8: ~44 binades, past the GEMM's range
};

// Multiplies K and V's rows of kv block j by 2^k_exponent(j) and 2^v_exponent(j) (rounded to f16 as stored).
void scaleBlocks(HostTensor &k, HostTensor &v, int64_t block_kv, BlockMagnitudes magnitudes) {
  if (magnitudes == BlockMagnitudes::uniform)
    return;
  for (int64_t h = 0; h < k.heads(); ++h)
    for (int64_t t = 0; t < k.tokens(); ++t) {
      const int64_t j = t / block_kv;
      const bool spread = magnitudes == BlockMagnitudes::spread, tiny = j % 4 == 1;
      const int k_exponent = spread ? static_cast<int>((j * 5) % 7 - 3) * 3 : (tiny ? -16 : 4);
      const int v_exponent = spread ? static_cast<int>((j * 3) % 5 - 2) * 4 : (tiny ? -16 : 8);
      for (int64_t c = 0; c < k.dim(); ++c) {
        k.set(0, h, t, c, std::ldexp(static_cast<double>(k.at(0, h, t, c)), k_exponent));
        v.set(0, h, t, c, std::ldexp(static_cast<double>(v.at(0, h, t, c)), v_exponent));
      }
    }
}

struct Case {
  std::string name;
  AttentionVariant variant;
  int64_t heads_q, heads_kv, tokens_q, tokens_kv;
  double min_cosine; // O against the reference run with the GPU's classes
  RandomTensorOptions q_options{1}, k_options{2, 0.0, 1.0, 1.0}, v_options{3};
  BlockMagnitudes magnitudes = BlockMagnitudes::uniform;
  StorageType storage = StorageType::f16; // of Q, K, V and O (the runner's input type)
};

schedules::InputType inputOf(StorageType storage) {
  return storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
}

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int head_dim : {64, 128}) {
    all.push_back({"sla-f16", dsl::preset("sla-f16", head_dim)->describe(), 2, 1, 1000, 1500, 0.999});
    all.push_back({"sla-int8", dsl::preset("sla-int8", head_dim)->describe(), 2, 2, 2048, 2048, 0.995});
    all.push_back({"sla-f16-elu", dsl::preset("sla-f16-elu", head_dim)->describe(), 2, 1, 777, 1024, 0.999});
    // Marginal blocks in the minority: H_i summed directly, without pre-aggregation.
    all.push_back({"sla-f16 k_h 40% k_l 20% relu",
                   dsl::attention("sla-minority")
                       .head_dim(head_dim)
                       .blocks(64, 64)
                       .qk(dsl::f16_qk())
                       .pv(dsl::f16(dsl::accum::f32))
                       .sla(dsl::sla_spec(FeatureMap::relu, 40.0, 20.0))
                       .describe(),
                   2, 1, 640, 640, 0.999});
    // Large K and V: h_j (~64 x 4 x 200 per entry) and H_i leave f16's range unless scaled, as the kernels do (the
    // states by a power of two per block, H_i by one per q block before its tensor-core product).
    Case large{"sla-f16 relu, |K| ~ 4, |V| ~ 200",
               dsl::attention("sla-large")
                   .head_dim(head_dim)
                   .blocks(64, 64)
                   .qk(dsl::f16_qk())
                   .pv(dsl::f16(dsl::accum::f32))
                   .sla(dsl::sla_spec(FeatureMap::relu, 5.0, 10.0))
                   .describe(),
               2,
               2,
               512,
               2048,
               0.999};
    large.k_options = {9, 4.0, 1.0, 0.0};
    large.v_options = {10, 200.0, 200.0, 0.0};
    all.push_back(large);
    // States of very different magnitudes across blocks: the mask GEMM's entries 2^(e_j - e_ref) down to f16
    // subnormals; past its range, the rows with such a marginal block are flagged and summed from the lookup table.
    const AttentionVariant relu = dsl::attention("sla-magnitudes")
                                      .head_dim(head_dim)
                                      .blocks(64, 64)
                                      .qk(dsl::f16_qk())
                                      .pv(dsl::f16(dsl::accum::f32))
                                      .sla(dsl::sla_spec(FeatureMap::relu, 5.0, 10.0))
                                      .describe();
    Case spread{"sla-f16 relu, states over 34 binades", relu, 2, 1, 768, 2048, 0.999};
    spread.k_options = {11, 0.0, 1.0, 0.0};
    spread.magnitudes = BlockMagnitudes::spread;
    all.push_back(spread);
    Case beyond{"sla-f16 relu, states over 44 binades", relu, 2, 2, 512, 1024, 0.999};
    beyond.k_options = {12, 0.0, 1.0, 0.0};
    beyond.magnitudes = BlockMagnitudes::beyond;
    all.push_back(beyond);
    // bf16 Q, K, V, O under the f16 cases' bounds: K with per-channel offsets (the default k_options), sharp logits
    // (Q and K with a standard deviation of 3: S / sqrt(d) ~ 9), and V with a standard deviation of 8e3 (its largest
    // values ~4e4, near f16's 65504: bf16 V beyond that overflows the sparse part's f16 P.V, a known limit). Four
    // bf16 modules in all (sla-f16 at both head dims, sla-int8 and sla-f16-elu at one), as in the backward's cases.
    const AttentionVariant sla_f16 = dsl::preset("sla-f16", head_dim)->describe();
    Case bf16{"bf16 sla-f16", sla_f16, 2, 1, 1000, 1500, 0.999};
    Case sharp{"bf16 sla-f16, sharp logits", sla_f16, 2, 2, 768, 1024, 0.999};
    sharp.q_options = {13, 0.0, 3.0, 0.0};
    sharp.k_options = {14, 0.0, 3.0, 0.0};
    Case huge{"bf16 sla-f16, |V| ~ 8e3", sla_f16, 2, 2, 512, 1024, 0.999};
    huge.v_options = {15, 0.0, 8e3, 0.0};
    Case other =
        head_dim == 128
            ? Case{"bf16 sla-int8", dsl::preset("sla-int8", head_dim)->describe(), 2, 2, 2048, 2048, 0.995}
            : Case{"bf16 sla-f16-elu", dsl::preset("sla-f16-elu", head_dim)->describe(), 2, 1, 777, 1024, 0.999};
    for (Case *item : {&bf16, &sharp, &huge, &other}) {
      item->storage = StorageType::bf16;
      all.push_back(*item);
    }
  }
  return all;
}

} // namespace

TEST_CASE("the SLA forward matches the CPU reference") {
  if (test::skipWithoutGpu("gpu_sla_test"))
    return;
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  driver.ensureContext(); // device 0's primary context, where the runners load their kernels
  for (const Case &item : cases()) {
    const AttentionVariant &variant = item.variant;
    const int64_t d = variant.head_dim;
    CAPTURE(item.name);
    CAPTURE(d);
    CAPTURE(std::string(nameOf(item.storage)));
    const HostTensor q = randomTensor(1, item.heads_q, item.tokens_q, d, item.storage, Layout::hnd, item.q_options);
    HostTensor k = randomTensor(1, item.heads_kv, item.tokens_kv, d, item.storage, Layout::hnd, item.k_options);
    HostTensor v = randomTensor(1, item.heads_kv, item.tokens_kv, d, item.storage, Layout::hnd, item.v_options);
    scaleBlocks(k, v, variant.block_kv, item.magnitudes);
    std::mt19937_64 generator(4);
    const Projection projection = randomProjection(d, generator, true);

    runtime::AttentionRunnerOptions options;
    options.ir_fingerprint = dsl::emitProgram(slaSparsePart(variant)).fingerprint(); // as the runner's
    options.input = inputOf(item.storage);
    const runtime::SlaRunner runner(variant, options);
    const schedules::ProblemShape shape{1, item.heads_q, item.heads_kv, item.tokens_q, item.tokens_kv, d};
    const runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(shape);
    const auto q_device = upload(q), k_device = upload(k), v_device = upload(v);
    const auto weight = upload(projection.weight), bias = upload(projection.bias);
    const size_t outputs = static_cast<size_t>(item.heads_q * item.tokens_q * d);
    DeviceBuffer o(outputs * 2), o_linear(outputs * 4), workspace(layout.total);
    runtime::SlaTensors tensors = hndInputs(q, k, v, *q_device, *k_device, *v_device, o.get());
    tensors.proj_weight = static_cast<const float *>(weight->get());
    tensors.proj_bias = static_cast<const float *>(bias->get());
    tensors.o_linear = static_cast<float *>(o_linear.get());
    runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
    driver.synchronizeContext();

    // P_c and the classes against the CPU's prediction.
    const MaskPrediction predicted = predictBlockClasses(variant, q, k);
    const size_t entries = predicted.classes.classes.size();
    const auto compressed = workspace.read<float>(layout.compressed, entries);
    const auto gpu_classes = workspace.read<signed char>(layout.classes, entries);
    const auto critical_mask = workspace.read<unsigned char>(layout.critical_mask, entries);
    double worst_compressed = 0.0;
    size_t mismatches = 0;
    BlockClasses classes = predicted.classes;
    for (size_t e = 0; e < entries; ++e) {
      worst_compressed = std::max(worst_compressed, std::fabs(compressed[e] - predicted.compressed[e]));
      classes.classes[e] = static_cast<BlockClass>(gpu_classes[e]);
      mismatches += classes.classes[e] != predicted.classes.classes[e] ? 1 : 0;
      CHECK(critical_mask[e] == (gpu_classes[e] == 1 ? 1 : 0));
    }
    CHECK(worst_compressed < 1e-5);
    CHECK(mismatches * 100 <= entries); // near-ties only

    // Every row has exactly the class counts, and the lookup tables list them in order.
    const int64_t kv_blocks = classes.kv_blocks, rows = static_cast<int64_t>(entries) / kv_blocks;
    const int64_t critical = criticalBlocksPerRow(variant.sla, kv_blocks);
    const int64_t negligible = negligibleBlocksPerRow(variant.sla, kv_blocks);
    const int64_t listed = layout.marginal_majority ? critical + negligible : kv_blocks - critical - negligible;
    const auto critical_lut = workspace.read<int>(layout.critical_lut, static_cast<size_t>(rows * critical));
    const auto linear_lut = workspace.read<int>(layout.linear_lut, static_cast<size_t>(rows * listed));
    for (int64_t row = 0; row < rows; ++row) {
      std::vector<int> expected_critical, expected_linear;
      for (int j = 0; j < kv_blocks; ++j) {
        const BlockClass cls = classes.classes[static_cast<size_t>(row * kv_blocks + j)];
        if (cls == BlockClass::critical)
          expected_critical.push_back(j);
        if ((cls == BlockClass::marginal) != layout.marginal_majority)
          expected_linear.push_back(j);
      }
      REQUIRE(static_cast<int64_t>(expected_critical.size()) == critical);
      REQUIRE(static_cast<int64_t>(expected_linear.size()) == listed);
      CHECK(std::equal(expected_critical.begin(), expected_critical.end(), critical_lut.begin() + row * critical));
      CHECK(std::equal(expected_linear.begin(), expected_linear.end(), linear_lut.begin() + row * listed));
    }

    // The mask GEMM flags exactly the rows with a marginal block past its range: none unless the states span more
    // than its 39 binades.
    const auto fallback = workspace.read<int>(layout.h_sum_fallback, static_cast<size_t>(rows));
    const auto flagged = static_cast<int64_t>(std::count(fallback.begin(), fallback.end(), 1));
    CHECK(std::count(fallback.begin(), fallback.end(), 0) + flagged == rows);
    if (item.magnitudes == BlockMagnitudes::beyond)
      CHECK(flagged > 0);
    else
      CHECK(flagged == 0);

    // O^l and O against the reference with the GPU's classes.
    const SlaResult reference = runSlaReference(variant, q, k, v, projection, &classes);
    const auto gpu_linear = o_linear.read<float>(0, outputs);
    const auto gpu_output_bits = o.read<uint16_t>(0, outputs);
    std::vector<double> gpu_output(outputs), linear(gpu_linear.begin(), gpu_linear.end());
    for (size_t e = 0; e < outputs; ++e)
      gpu_output[e] = item.storage == StorageType::bf16 ? numerics::bfloat16BitsToFloat(gpu_output_bits[e])
                                                        : numerics::halfBitsToFloat(gpu_output_bits[e]);
    const AccuracyMetrics linear_metrics = compareOutputs(reference.linear, linear);
    const AccuracyMetrics output_metrics = compareOutputs(reference.output, gpu_output);
    // The states h_j are stored in f16 (11 significant bits, power-of-two scaled; the products run on split f16
    // operands, ~22 bits; bf16 modules' state products on split bf16 ones, ~16 bits): O^l's expected rel-L1 is ~1e-4
    // (a host model of the rounding gives 6e-5 at d = 64), under the same bounds as when the states were f32.
    CHECK(linear_metrics.cosine_similarity > 0.99999);
    CHECK(linear_metrics.relative_l1 < 1e-3);
    CHECK(output_metrics.cosine_similarity > item.min_cosine);
    CHECK(std::all_of(gpu_output.begin(), gpu_output.end(), [](double x) { return std::isfinite(x); }));
    std::printf("gpu_sla_test: %-36s d%-3lld pre-aggregation %-3s P_c max err %.2e, classes differing %zu/%zu, "
                "GEMM rows flagged %lld/%lld, O^l cos %.7f rel-L1 %.2e, O cos %.6f rel-L1 %.4f\n",
                item.name.c_str(), static_cast<long long>(d), layout.marginal_majority ? "yes" : "no", worst_compressed,
                mismatches, entries, static_cast<long long>(flagged), static_cast<long long>(rows),
                linear_metrics.cosine_similarity, linear_metrics.relative_l1, output_metrics.cosine_similarity,
                output_metrics.relative_l1);
  }
}

TEST_CASE("the SLA backward matches the CPU reference's gradients") {
  if (test::skipWithoutGpu("gpu_sla_test"))
    return;
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  driver.ensureContext();
  struct BackwardCase {
    std::string name;
    AttentionVariant variant;
    int64_t heads_q, heads_kv, tokens_q, tokens_kv;
    // Per-q-block magnitudes of dO (so of dH_i, which the backward's mask GEMM sums): 2^-30..2^0 (~30 binades; not
    // above 1: the sparse part rounds dO and dS to f16), or every fourth q block 2^-48 (past the GEMM's 39 binades:
    // those columns are flagged and summed from the tables).
    BlockMagnitudes d_output_magnitudes = BlockMagnitudes::uniform;
    StorageType storage = StorageType::f16;
    double v_scale = 1.0; // V's standard deviation
  };
  std::vector<BackwardCase> backward_cases;
  for (int head_dim : {64, 128}) {
    backward_cases.push_back({"sla-f16", dsl::preset("sla-f16", head_dim)->describe(), 2, 1, 700, 1300});
    backward_cases.push_back({"sla-f16-elu", dsl::preset("sla-f16-elu", head_dim)->describe(), 1, 1, 512, 512});
    backward_cases.push_back({"k_h 30% k_l 20% relu",
                              dsl::attention("sla-minority")
                                  .head_dim(head_dim)
                                  .blocks(64, 64)
                                  .qk(dsl::f16_qk())
                                  .pv(dsl::f16(dsl::accum::f32))
                                  .sla(dsl::sla_spec(FeatureMap::relu, 30.0, 20.0))
                                  .describe(),
                              2, 2, 640, 640});
    for (BlockMagnitudes magnitudes : {BlockMagnitudes::spread, BlockMagnitudes::beyond})
      backward_cases.push_back(
          {magnitudes == BlockMagnitudes::spread ? "sla-f16 dO over 30 binades" : "sla-f16 dO over 48 binades",
           dsl::preset("sla-f16", head_dim)->describe(), 2, 1, 1024, 768, magnitudes});
    // A quantized sparse part: its forward's L is not the exact formula's, so the statistics kernel runs even with
    // O^s given.
    backward_cases.push_back({"sla-int8", dsl::preset("sla-int8", head_dim)->describe(), 2, 2, 640, 900});
    // bf16: the sparse part's operands (Q, K, V, dO^s, P, dS) are bf16 there. The forward's four bf16 modules.
    const BlockMagnitudes uniform = BlockMagnitudes::uniform;
    const StorageType bf16 = StorageType::bf16;
    backward_cases.push_back(
        {"bf16 sla-f16", dsl::preset("sla-f16", head_dim)->describe(), 2, 1, 700, 1300, uniform, bf16});
    backward_cases.push_back(
        {"bf16 sla-f16 |V| ~ 8e3", dsl::preset("sla-f16", head_dim)->describe(), 2, 2, 512, 768, uniform, bf16, 8e3});
    if (head_dim == 128)
      backward_cases.push_back(
          {"bf16 sla-int8", dsl::preset("sla-int8", head_dim)->describe(), 2, 2, 640, 900, uniform, bf16});
    else
      backward_cases.push_back(
          {"bf16 sla-f16-elu", dsl::preset("sla-f16-elu", head_dim)->describe(), 1, 1, 512, 512, uniform, bf16});
  }
  for (const BackwardCase &item : backward_cases) {
    const AttentionVariant &variant = item.variant;
    const int64_t d = variant.head_dim;
    CAPTURE(item.name);
    CAPTURE(d);
    CAPTURE(std::string(nameOf(item.storage)));
    const HostTensor q = randomTensor(1, item.heads_q, item.tokens_q, d, item.storage, Layout::hnd, {5});
    const HostTensor k = randomTensor(1, item.heads_kv, item.tokens_kv, d, item.storage, Layout::hnd, {6});
    const HostTensor v =
        randomTensor(1, item.heads_kv, item.tokens_kv, d, item.storage, Layout::hnd, {7, 0.0, item.v_scale});
    std::mt19937_64 generator(8); // Proj, then dO
    const Projection projection = randomProjection(d, generator, false);
    const size_t q_size = static_cast<size_t>(item.heads_q * item.tokens_q * d);
    const size_t kv_size = static_cast<size_t>(item.heads_kv * item.tokens_kv * d);
    std::vector<double> d_output(q_size), d_linear(q_size, 0.0);
    std::normal_distribution<double> unit;
    for (size_t e = 0; e < q_size; ++e) {
      const int64_t block = static_cast<int64_t>(e / static_cast<size_t>(d)) % item.tokens_q / variant.block_q;
      const int exponent = item.d_output_magnitudes == BlockMagnitudes::spread
                               ? static_cast<int>((block * 5) % 7) * 5 - 30
                           : item.d_output_magnitudes == BlockMagnitudes::beyond ? (block % 4 == 1 ? -48 : 0)
                                                                                 : 0;
      d_output[e] = static_cast<float>(std::ldexp(unit(generator), exponent));
    }
    for (size_t row = 0; row < q_size / static_cast<size_t>(d); ++row) // dO^l = dO W: what nn.Linear's backward gives
      for (int64_t out = 0; out < d; ++out)
        for (int64_t in = 0; in < d; ++in)
          d_linear[row * d + in] += d_output[row * d + out] * projection.weight[out * d + in];

    runtime::AttentionRunnerOptions options;
    options.input = inputOf(item.storage);
    const runtime::SlaRunner runner(variant, options);
    const schedules::ProblemShape shape{1, item.heads_q, item.heads_kv, item.tokens_q, item.tokens_kv, d};
    const runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(shape, true);
    const auto q_device = upload(q), k_device = upload(k), v_device = upload(v);
    const auto weight = upload(projection.weight), d_sparse = upload(d_output), d_linear_device = upload(d_linear);
    const bool exact = slaSparsePartIsExact(variant);
    CHECK(exact == (item.name.find("sla-int8") == std::string::npos)); // the quantized sparse part, f16 or bf16
    const size_t rows = q_size / static_cast<size_t>(d);
    std::optional<BlockClasses> classes;
    std::optional<SlaGradients> reference;
    // Both ways to L and D^s: the statistics kernel (Proj applied in place, no O^s to pass), and the forward's saved L
    // with D^s from its O^s (Proj left to the caller, O^s passed), which a quantized sparse part declines.
    for (const bool pass_o_sparse : {false, true}) {
      const bool saved = exact && pass_o_sparse;
      CAPTURE(pass_o_sparse);
      DeviceBuffer o(q_size * 2), workspace(layout.total), dq(q_size * 4), dk(kv_size * 4), dv(kv_size * 4);
      runtime::SlaTensors tensors = hndInputs(q, k, v, *q_device, *k_device, *v_device, o.get());
      tensors.proj_weight = pass_o_sparse ? nullptr : static_cast<const float *>(weight->get());
      if (pass_o_sparse) { // a forward without the backward's regions saves no L, and says so in the workspace
        runner.run(shape, tensors, workspace.get(), runner.workspaceLayout(shape).total, nullptr);
        CHECK(workspace.read<int>(layout.lse_saved, 1)[0] == 0);
      }
      runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr);
      CHECK(workspace.read<int>(layout.lse_saved, 1)[0] == (saved ? 1 : 0)); // Proj in place: O^s is gone
      const auto forward_lse = workspace.read<float>(layout.lse, rows);
      runtime::SlaBackwardTensors gradients;
      gradients.q = tensors.q;
      gradients.k = tensors.k;
      gradients.v = tensors.v;
      gradients.q_strides = tensors.q_strides;
      gradients.k_strides = tensors.k_strides;
      gradients.v_strides = tensors.v_strides;
      gradients.d_sparse = static_cast<const float *>(d_sparse->get());
      gradients.d_linear = static_cast<const float *>(d_linear_device->get());
      gradients.dq = static_cast<float *>(dq.get());
      gradients.dk = static_cast<float *>(dk.get());
      gradients.dv = static_cast<float *>(dv.get());
      if (pass_o_sparse) {
        gradients.o_sparse = o.get();
        gradients.o_sparse_strides = hndStrides(q);
      }
      runner.backward(shape, gradients, workspace.get(), workspace.bytes, nullptr);
      driver.synchronizeContext();

      const size_t entries = static_cast<size_t>(item.heads_q) * layout.shape.q_blocks * layout.shape.kv_blocks;
      const auto gpu_classes = workspace.read<signed char>(layout.classes, entries);
      BlockClasses run_classes{1, item.heads_q, layout.shape.q_blocks, layout.shape.kv_blocks, {}};
      for (signed char cls : gpu_classes)
        run_classes.classes.push_back(static_cast<BlockClass>(cls));
      if (!classes) {
        classes = run_classes;
        reference = runSlaBackward(variant, q, k, v, projection, *classes, d_output);
      }
      REQUIRE(run_classes.classes == classes->classes); // the same prediction both times: one reference
      // The backward's mask GEMM flags exactly the kv blocks with a marginal dH_i past its range.
      const auto column_fallback = workspace.read<int>(
          layout.dh_sum_fallback, static_cast<size_t>(item.heads_kv) * static_cast<size_t>(layout.shape.kv_blocks));
      const auto flagged = std::count(column_fallback.begin(), column_fallback.end(), 1);
      CHECK(std::count(column_fallback.begin(), column_fallback.end(), 0) + flagged ==
            static_cast<std::ptrdiff_t>(column_fallback.size()));
      if (item.d_output_magnitudes == BlockMagnitudes::beyond)
        CHECK(flagged > 0);
      else
        CHECK(flagged == 0);
      // L as the fused kernel read it: the forward's where it was saved (the statistics kernel returned without
      // writing), else the statistics kernel's. Both the exact sparse part's natural-log L of S / sqrt(d); the
      // forward writes its L only where it can be used (saved).
      const auto gpu_lse = workspace.read<float>(layout.lse, rows);
      double worst_lse = 0.0, worst_forward_lse = 0.0;
      for (size_t row = 0; row < rows; ++row) {
        worst_lse = std::max(worst_lse, std::fabs(gpu_lse[row] - reference->sparse_lse[row]));
        if (saved)
          worst_forward_lse = std::max(worst_forward_lse, std::fabs(forward_lse[row] - reference->sparse_lse[row]));
      }
      CHECK(worst_lse < 1e-3);
      CHECK(worst_forward_lse < 1e-3);
      if (saved)
        CHECK(std::equal(gpu_lse.begin(), gpu_lse.end(), forward_lse.begin()));
      for (const auto &[name, buffer, expected] :
           {std::tuple<const char *, const DeviceBuffer *, const std::vector<double> *>{"dq", &dq, &reference->dq},
            {"dk", &dk, &reference->dk},
            {"dv", &dv, &reference->dv}}) {
        const auto values = buffer->read<float>(0, expected->size());
        const AccuracyMetrics metrics = compareOutputs(*expected, std::vector<double>(values.begin(), values.end()));
        CAPTURE(std::string(name));
        // The sparse part runs on tensor cores with dO^s, P and dS rounded to f16 (relative 2^-12 each, as
        // FlashAttention-2's backward; with a saved L, D^s comes from the f16 O^s) and dH_i is stored in f16 like h_j:
        // ~1e-3 rel-L1 expected, under the bounds the f32 CUDA-core version had. A bf16 module rounds dO^s, P, dS
        // (and O^s) to bf16, whose unit roundoff is 8x f16's: the f16 bounds with the errors scaled by 8 (rel-L1) and
        // the cosine's distance from 1 by 64 (it is quadratic in the error).
        const bool bf16 = item.storage == StorageType::bf16;
        CHECK(metrics.cosine_similarity > (bf16 ? 1.0 - 64 * 1e-4 : 0.9999));
        CHECK(metrics.relative_l1 < (bf16 ? 8 * 5e-3 : 5e-3));
        std::printf("gpu_sla_test: backward %-26s d%-3lld L %-10s %s cos %.7f rel-L1 %.2e (GEMM columns flagged "
                    "%lld/%zu)\n",
                    item.name.c_str(), static_cast<long long>(d), saved ? "saved" : "recomputed", name,
                    metrics.cosine_similarity, metrics.relative_l1, static_cast<long long>(flagged),
                    column_fallback.size());
      }
    }
  }
}
