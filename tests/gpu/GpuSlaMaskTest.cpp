// SLA's mask prediction on the GPU alone (RunPhase::prologue): pool(Q) and pool(K) against the host's means, P_c, the
// classes and the lookup tables against the CPU reference, for shapes the forward test does not reach (more than 1024
// kv blocks, not a power of two; the most, 4096; rows of a CTA past q_blocks; a Q the 16-byte loads cannot read) and
// for exact ties: K made of a few constant blocks gives equal pooled rows, whose order must be the reference's (the
// lower kv block first) with no class differing. Skipped, with a message, where no GPU is present.
#include "../support/SkipWithoutGpu.h"
#include "NanFilledDeviceBuffer.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/Sla.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/SlaRunner.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::reference;

namespace {

using DeviceBuffer = test::NanFilledDeviceBuffer;

// An HND tensor on the device with `token_stride` elements per token (>= dim; more leaves gaps, as a view would).
struct DeviceTensor {
  std::unique_ptr<DeviceBuffer> buffer;
  SageTensorStrides strides{};
};

DeviceTensor upload(const HostTensor &tensor, int64_t token_stride) {
  const int64_t heads = tensor.heads(), tokens = tensor.tokens(), dim = tensor.dim();
  std::vector<uint16_t> bits(static_cast<size_t>(tensor.batch() * heads * tokens * token_stride), 0);
  for (int64_t b = 0; b < tensor.batch(); ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < dim; ++c)
          bits[static_cast<size_t>(((b * heads + h) * tokens + t) * token_stride + c)] =
              numerics::floatToHalfBits(tensor.at(b, h, t, c));
  DeviceTensor device{std::make_unique<DeviceBuffer>(bits.size() * 2),
                      {heads * tokens * token_stride, tokens * token_stride, token_stride}};
  device.buffer->driver.copyToDevice(device.buffer->pointer, bits.data(), device.buffer->bytes);
  return device;
}

// Block means in double, [heads][blocks][dim].
std::vector<double> blockMeans(const HostTensor &tensor, int64_t block) {
  const int64_t blocks = (tensor.tokens() + block - 1) / block, dim = tensor.dim();
  std::vector<double> means(static_cast<size_t>(tensor.heads() * blocks * dim), 0.0);
  for (int64_t h = 0; h < tensor.heads(); ++h)
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t begin = i * block, end = std::min(tensor.tokens(), begin + block);
      for (int64_t c = 0; c < dim; ++c) {
        double sum = 0.0;
        for (int64_t t = begin; t < end; ++t)
          sum += tensor.at(0, h, t, c);
        means[static_cast<size_t>((h * blocks + i) * dim + c)] = sum / static_cast<double>(end - begin);
      }
    }
  return means;
}

// K whose block j holds, in every token, pattern j % patterns (N(0, 1) rows, f16-exact): blocks of one pattern pool to
// equal means on the GPU too (a sum of equal f16 values is exact in f32), so their logits tie exactly.
HostTensor patternedKeys(int64_t heads, int64_t tokens, int64_t dim, int64_t block, int64_t patterns) {
  const HostTensor rows = randomTensor(1, heads, patterns, dim, StorageType::f16, Layout::hnd, {11});
  HostTensor k(1, heads, tokens, dim, StorageType::f16, Layout::hnd);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < dim; ++c)
        k.set(0, h, t, c, rows.at(0, h, (t / block) % patterns, c));
  return k;
}

AttentionVariant slaVariant(int head_dim, double critical_percent, double negligible_percent) {
  return dsl::attention("sla-mask")
      .head_dim(head_dim)
      .blocks(64, 64)
      .qk(dsl::f16_qk())
      .pv(dsl::f16(dsl::accum::f32))
      .sla(dsl::sla_spec(FeatureMap::softmax, critical_percent, negligible_percent))
      .describe();
}

struct Case {
  std::string name;
  AttentionVariant variant;
  int64_t heads_q, heads_kv, tokens_q, tokens_kv;
  int64_t k_patterns = 0;  // > 0: patternedKeys with this many patterns (exact ties: no class may differ)
  int64_t q_token_pad = 0; // extra elements per Q token: the pooling's scalar path
  double near_ties = 0.01; // the fraction of classes that may differ from the reference's (f32 vs double)
};

std::vector<Case> cases() {
  const AttentionVariant f16_128 = dsl::preset("sla-f16", 128)->describe();
  std::vector<Case> all;
  all.push_back({"1101 kv blocks, 18 q blocks", f16_128, 2, 1, 1100, 64 * 1100 + 17});
  all.push_back({"4096 kv blocks", f16_128, 2, 1, 640, 64 * 4096});
  all.push_back({"Q tokens padded by 3 (unaligned)", dsl::preset("sla-f16", 64)->describe(), 2, 2, 1000, 1500, 0, 3});
  Case ties{"3 K patterns: ties at T_c and T_n", f16_128, 2, 1, 1100, 64 * 300, 3};
  ties.near_ties = 0.0;
  all.push_back(ties);
  Case minority{"3 K patterns, k_h 40% k_l 20%", slaVariant(128, 40.0, 20.0), 2, 2, 700, 64 * 301 - 5, 3};
  minority.near_ties = 0.0;
  all.push_back(minority);
  Case equal{"every K block equal", slaVariant(64, 5.0, 10.0), 1, 1, 512, 64 * 1500, 1};
  equal.near_ties = 0.0;
  all.push_back(equal);
  return all;
}

} // namespace

TEST_CASE("the SLA mask prediction matches the CPU reference, ties included") {
  if (test::skipWithoutGpu("gpu_sla_mask_test"))
    return;
  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  driver.ensureContext();
  for (const Case &item : cases()) {
    const AttentionVariant &variant = item.variant;
    const int64_t d = variant.head_dim;
    CAPTURE(item.name);
    const HostTensor q = randomTensor(1, item.heads_q, item.tokens_q, d, StorageType::f16, Layout::hnd, {1});
    const HostTensor k =
        item.k_patterns > 0
            ? patternedKeys(item.heads_kv, item.tokens_kv, d, variant.block_kv, item.k_patterns)
            : randomTensor(1, item.heads_kv, item.tokens_kv, d, StorageType::f16, Layout::hnd, {2, 0.0, 1.0, 1.0});
    runtime::AttentionRunnerOptions options;
    options.ir_fingerprint = dsl::emitProgram(slaSparsePart(variant)).fingerprint(); // as the runner's
    const runtime::SlaRunner runner(variant, options);
    const schedules::ProblemShape shape{1, item.heads_q, item.heads_kv, item.tokens_q, item.tokens_kv, d};
    const runtime::SlaWorkspaceLayout layout = runner.workspaceLayout(shape);
    const DeviceTensor q_device = upload(q, d + item.q_token_pad), k_device = upload(k, d);
    DeviceBuffer o(2), workspace(layout.total);
    runtime::SlaTensors tensors;
    tensors.q = q_device.buffer->get();
    tensors.k = k_device.buffer->get();
    tensors.v = k_device.buffer->get(); // not read by the prologue
    tensors.q_strides = q_device.strides;
    tensors.k_strides = k_device.strides;
    tensors.v_strides = k_device.strides;
    tensors.o = o.get();
    runner.run(shape, tensors, workspace.get(), workspace.bytes, nullptr, runtime::RunPhase::prologue);
    driver.synchronizeContext();

    // pool(Q) [h_q][q_blocks][d] and pool(K) [h_kv][d][kv_blocks] (transposed) against the host's means.
    const int64_t q_blocks = layout.shape.q_blocks, kv_blocks = layout.shape.kv_blocks;
    const std::vector<double> q_means = blockMeans(q, variant.block_q), k_means = blockMeans(k, variant.block_kv);
    const auto pooled_q = workspace.read<float>(layout.pooled_q, q_means.size());
    const auto pooled_k = workspace.read<float>(layout.pooled_k, k_means.size());
    double worst_pool = 0.0;
    for (size_t e = 0; e < q_means.size(); ++e)
      worst_pool = std::max(worst_pool, std::fabs(pooled_q[e] - q_means[e]));
    for (int64_t h = 0; h < item.heads_kv; ++h)
      for (int64_t j = 0; j < kv_blocks; ++j)
        for (int64_t c = 0; c < d; ++c)
          worst_pool = std::max(worst_pool, std::fabs(pooled_k[static_cast<size_t>((h * d + c) * kv_blocks + j)] -
                                                      k_means[static_cast<size_t>((h * kv_blocks + j) * d + c)]));
    CHECK(worst_pool < 1e-5);

    // P_c and the classes against the CPU's prediction; the classes against the GPU's own P_c (every critical block
    // at least as probable as every other, every negligible one at most as probable), which holds exactly.
    const MaskPrediction predicted = predictBlockClasses(variant, q, k);
    const size_t entries = predicted.classes.classes.size();
    const auto compressed = workspace.read<float>(layout.compressed, entries);
    const auto classes = workspace.read<signed char>(layout.classes, entries);
    const auto critical_mask = workspace.read<unsigned char>(layout.critical_mask, entries);
    const int64_t critical = criticalBlocksPerRow(variant.sla, kv_blocks);
    const int64_t negligible = negligibleBlocksPerRow(variant.sla, kv_blocks);
    const int64_t listed = layout.marginal_majority ? critical + negligible : kv_blocks - critical - negligible;
    const int64_t rows = item.heads_q * q_blocks;
    const auto critical_lut = workspace.read<int>(layout.critical_lut, static_cast<size_t>(rows * critical));
    const auto linear_lut = workspace.read<int>(layout.linear_lut, static_cast<size_t>(rows * listed));
    double worst_compressed = 0.0;
    size_t mismatches = 0, misordered_rows = 0;
    for (int64_t row = 0; row < rows; ++row) {
      float critical_min = INFINITY, other_max = -INFINITY, negligible_max = -INFINITY, other_min = INFINITY;
      std::vector<int> expected_critical, expected_linear;
      for (int64_t j = 0; j < kv_blocks; ++j) {
        const auto e = static_cast<size_t>(row * kv_blocks + j);
        worst_compressed = std::max(worst_compressed, std::fabs(compressed[e] - predicted.compressed[e]));
        mismatches += classes[e] != static_cast<signed char>(predicted.classes.classes[e]) ? 1 : 0;
        CHECK(critical_mask[e] == (classes[e] == 1 ? 1 : 0));
        if (classes[e] == 1)
          critical_min = std::min(critical_min, compressed[e]);
        else
          other_max = std::max(other_max, compressed[e]);
        if (classes[e] == -1)
          negligible_max = std::max(negligible_max, compressed[e]);
        else
          other_min = std::min(other_min, compressed[e]);
        if (classes[e] == 1)
          expected_critical.push_back(static_cast<int>(j));
        if ((classes[e] == 0) != layout.marginal_majority)
          expected_linear.push_back(static_cast<int>(j));
      }
      misordered_rows += critical_min < other_max || negligible_max > other_min ? 1 : 0;
      REQUIRE(static_cast<int64_t>(expected_critical.size()) == critical);
      REQUIRE(static_cast<int64_t>(expected_linear.size()) == listed);
      CHECK(std::equal(expected_critical.begin(), expected_critical.end(), critical_lut.begin() + row * critical));
      CHECK(std::equal(expected_linear.begin(), expected_linear.end(), linear_lut.begin() + row * listed));
    }
    CHECK(misordered_rows == 0);
    CHECK(worst_compressed < 1e-6);
    CHECK(static_cast<double>(mismatches) <= item.near_ties * static_cast<double>(entries));
    std::printf("gpu_sla_mask_test: %-34s d%-3lld %4lld x %4lld blocks, pool max err %.2e, P_c max err %.2e, "
                "classes differing %zu/%zu\n",
                item.name.c_str(), static_cast<long long>(d), static_cast<long long>(q_blocks),
                static_cast<long long>(kv_blocks), worst_pool, worst_compressed, mismatches, entries);
  }
}
