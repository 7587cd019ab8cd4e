// The quantization prologue alone on the GPU: its launches run straight from PrologueGenerator's output (no
// attention kernel), on random Q, K and V. Skipped, with a message, where no GPU is present.
//  - The workspace holds, byte for byte, what PrologueWorkspaceModel.h computes on the CPU (the quantizers of
//    sage/numerics and the kernels' order of summation), for the presets and the hand-built variant kinds.
//  - v_codes in the wgmma token order hold exactly the natural prologue's codes, permuted within each group of
//    32 tokens, and every other byte of the workspace is unchanged.
//  - The prologue's time per call and bandwidth at hidden 2048 (d = 64 and 128), N = 1k..16k, for the lead's
//    before/after measurements (printed; `tools/gpu-check --run` shows the lines).
#include "../prologue/PrologueTestVariants.h"
#include "../support/SkipWithoutGpu.h"
#include "DevicePrologue.h"
#include "PrologueWorkspaceModel.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/codegen/PrologueLaunch.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/HostTensor.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/PrologueRotation.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

using namespace sage;
using reference::HostTensor;
using reference::Layout;
using reference::StorageType;

namespace {

bool skipWithoutGpu() { return sage::test::skipWithoutGpu("gpu_prologue_test"); }

using test::DeviceBuffer;
using test::DevicePrologue;
using test::driver;

// A host tensor's 16-bit values in its storage layout, on the device.
std::unique_ptr<DeviceBuffer> upload(const HostTensor &tensor) {
  std::vector<uint16_t> bits(tensor.values().size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = tensor.storage() == StorageType::bf16 ? numerics::floatToBfloat16Bits(tensor.values()[i])
                                                    : numerics::floatToHalfBits(tensor.values()[i]);
  auto buffer = std::make_unique<DeviceBuffer>(bits.size() * 2);
  driver().copyToDevice(buffer->pointer, bits.data(), buffer->bytes);
  return buffer;
}

SageTensorStrides stridesOf(const HostTensor &tensor) {
  const int64_t d = tensor.dim();
  if (tensor.layout() == Layout::hnd)
    return {tensor.heads() * tensor.tokens() * d, tensor.tokens() * d, d};
  return {tensor.heads() * tensor.tokens() * d, d, tensor.heads() * d};
}

// Q, K and V of one shape on the device, and a workspace for a variant.
struct PrologueProblem {
  schedules::ProblemShape shape;
  HostTensor q, k, v;
  std::unique_ptr<DeviceBuffer> q_device, k_device, v_device;

  PrologueProblem(const schedules::ProblemShape &problem, StorageType storage, Layout layout)
      : shape(problem),
        q(reference::randomTensor(shape.batch, shape.heads_q, shape.tokens_q, shape.head_dim, storage, layout, {11})),
        k(reference::randomTensor(shape.batch, shape.heads_kv, shape.tokens_kv, shape.head_dim, storage, layout,
                                  {12, 0, 1, 3.0})),
        v(reference::randomTensor(shape.batch, shape.heads_kv, shape.tokens_kv, shape.head_dim, storage, layout, {13})),
        q_device(upload(q)), k_device(upload(k)), v_device(upload(v)) {}

  SagePrologueParams params(const AttentionVariant &variant, const schedules::WorkspaceLayout &layout,
                            unsigned char *workspace) const {
    return codegen::makePrologueParams(variant, shape, layout, {q_device->get(), stridesOf(q)},
                                       {k_device->get(), stridesOf(k)}, {v_device->get(), stridesOf(v)}, workspace);
  }
};

// Runs the prologue once on a workspace filled with 0xff and returns the workspace's bytes.
std::vector<unsigned char> workspaceAfter(const DevicePrologue &prologue, const PrologueProblem &problem,
                                          const AttentionVariant &variant, const schedules::WorkspaceLayout &layout) {
  // The workspace pointer is only checked here (workspaceAfter passes its own): any 256-byte aligned value.
  return prologue.workspaceAfter(problem.shape, layout,
                                 problem.params(variant, layout, reinterpret_cast<unsigned char *>(uintptr_t{256})));
}

// The variants whose workspace the model covers, each with an input type and layout.
struct ModelCase {
  AttentionVariant variant;
  StorageType storage;
  Layout layout;
};

std::vector<ModelCase> modelCases() {
  std::vector<ModelCase> cases;
  int index = 0;
  for (int head_dim : {64, 128}) {
    std::vector<AttentionVariant> variants;
    for (const char *preset : {"sage-b", "sage-t", "sage-vb", "sage-vt", "sage2-fp8"})
      variants.push_back(dsl::preset(preset, head_dim)->describe());
    for (const prologue_test::VariantKind &kind : prologue_test::variantKinds())
      if (kind.granularity != Granularity::none) // the model does not cover casts
        variants.push_back(prologue_test::makeVariant(kind, head_dim));
    // FP4 (issue 11): K and V^T of the presets (their Q is smoothed, which the model leaves out), and Q too once
    // unsmoothed.
    for (const char *preset : {"sage3-fp4", "sage3-mxfp4"}) {
      AttentionVariant fp4 = dsl::preset(preset, head_dim)->describe();
      variants.push_back(fp4);
      fp4.smooth_q = SmoothScope::none;
      fp4.name += "-unsmoothed-q";
      variants.push_back(fp4);
    }
    // Issue 28: Q and K rotated before psi, per token, per block and per warp.
    for (const char *preset : {"sage-b", "sage-t", "sage2-fp8"}) {
      AttentionVariant rotated = dsl::preset(preset, head_dim)->describe();
      rotated.name += "-rotated";
      rotated.q.rotation_seed = rotated.k.rotation_seed = 77;
      variants.push_back(rotated);
    }
    for (const AttentionVariant &variant : variants) {
      cases.push_back(
          {variant, index % 2 ? StorageType::bf16 : StorageType::f16, index % 3 ? Layout::hnd : Layout::nhd});
      ++index;
    }
  }
  // Issue 28: head dims whose rows leave lanes idle (d = 80: 10 vectors on 16 lanes; d = 192: 24 on 32)
  for (int head_dim : {80, 192})
    for (const char *preset : {"sage-b", "sage-t", "sage-vb", "sage-vt", "sage2-fp8"}) {
      cases.push_back({dsl::preset(preset, head_dim)->describe(), index % 2 ? StorageType::bf16 : StorageType::f16,
                       index % 3 ? Layout::hnd : Layout::nhd});
      ++index;
    }
  return cases;
}

// Compares one buffer of the workspace with the model; prints the first differences.
bool sameBytes(const prologue_model::ExpectedBuffer &expected, const std::vector<unsigned char> &workspace) {
  size_t differences = 0;
  for (size_t i = 0; i < expected.bytes.size(); ++i)
    if (workspace[expected.slice.offset + i] != expected.bytes[i] && differences++ < 3)
      std::printf("gpu_prologue_test:   %s byte %zu: GPU 0x%02x, model 0x%02x\n", expected.name.c_str(), i,
                  workspace[expected.slice.offset + i], expected.bytes[i]);
  if (differences > 0)
    std::printf("gpu_prologue_test:   %s: %zu of %zu bytes differ\n", expected.name.c_str(), differences,
                expected.bytes.size());
  return differences == 0;
}

} // namespace

TEST_CASE("the CPU model of the workspace is close to the exact statistics and quantizes within half a step") {
  // Runs without a GPU: a sanity check of the oracle itself (its bits are checked against the GPU below).
  const AttentionVariant variant = dsl::preset("sage-vb", 64)->describe();
  const schedules::ProblemShape shape{1, 2, 2, 130, 700, 64};
  const reference::HostTensor q = reference::randomTensor(1, 2, 130, 64, StorageType::f16, Layout::hnd, {1});
  const reference::HostTensor k = reference::randomTensor(1, 2, 700, 64, StorageType::f16, Layout::hnd, {2, 0, 1, 4});
  const reference::HostTensor v = reference::randomTensor(1, 2, 700, 64, StorageType::f16, Layout::hnd, {3});
  const schedules::WorkspaceLayout layout =
      schedules::computeWorkspaceLayout(variant, shape, schedules::InputType::f16);
  const codegen::PrologueConfig config = codegen::makePrologueConfig(variant, schedules::InputType::f16, 64, {});
  const std::vector<prologue_model::ExpectedBuffer> buffers =
      prologue_model::expectedWorkspace(variant, config, layout, q, k, v, codegen::prologueQPrescale(variant));
  const auto buffer = [&](const std::string &name) -> const std::vector<unsigned char> & {
    for (const prologue_model::ExpectedBuffer &b : buffers)
      if (b.name == name)
        return b.bytes;
    FAIL("no buffer " << name);
    return buffers.front().bytes;
  };
  const auto floatAt = [](const std::vector<unsigned char> &bytes, int64_t index) {
    float value;
    std::memcpy(&value, bytes.data() + index * 4, 4);
    return value;
  };
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t c = 0; c < 64; ++c) {
      double sum = 0.0;
      for (int64_t t = 0; t < 700; ++t)
        sum += k.at(0, h, t, c);
      const float mean = floatAt(buffer("k_mean"), h * 64 + c);
      CHECK(std::fabs(mean - sum / 700.0) <= 1e-5 * (std::fabs(sum / 700.0) + 1.0));
      // psi_K per block: |code * scale - (K - mean)| <= scale / 2 (plus the f32 rounding of the product).
      for (int64_t t = 0; t < 700; t += 37) {
        const float scale = floatAt(buffer("k_scales"), h * layout.k_scale_count + t / 64);
        const auto code = static_cast<int8_t>(buffer("k_codes")[(h * layout.padded_kv + t) * 64 + c]);
        CHECK(std::fabs(code * scale - (k.at(0, h, t, c) - mean)) <= 0.5001 * scale);
      }
      // Per-channel psi_V: codes of the transposed V.
      const float v_scale = floatAt(buffer("v_scales"), h * 64 + c);
      for (int64_t t = 0; t < 700; t += 41) {
        const auto code = static_cast<int8_t>(buffer("v_codes")[(h * 64 + c) * layout.padded_kv + t]);
        CHECK(std::fabs(code * v_scale - v.at(0, h, t, c)) <= 0.5001 * v_scale);
      }
      CHECK(buffer("v_codes")[(h * 64 + c) * layout.padded_kv + 700] == 0); // padding
    }
}

TEST_CASE("the workspace is the CPU model's, byte for byte") {
  if (skipWithoutGpu())
    return;
  driver().ensureContext(); // runners launch in their own context and leave the thread's as it was
  int checked = 0;
  for (const ModelCase &c : modelCases()) {
    const AttentionVariant &variant = c.variant;
    const int head_dim = variant.head_dim;
    const schedules::InputType input =
        c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
    // Several slices of 500 tokens per KV head (4 KV heads), ragged last blocks, GQA.
    const schedules::ProblemShape shape{2, 4, 2, 300, 2999, head_dim};
    const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, shape, input);
    const PrologueProblem problem(shape, c.storage, c.layout);
    const std::vector<unsigned char> workspace =
        workspaceAfter(DevicePrologue(variant, input, {}), problem, variant, layout);
    const codegen::PrologueConfig config = codegen::makePrologueConfig(variant, input, head_dim, {});
    const std::vector<prologue_model::ExpectedBuffer> expected = prologue_model::expectedWorkspace(
        variant, config, layout, problem.q, problem.k, problem.v, codegen::prologueQPrescale(variant));
    std::string names;
    bool all_same = true;
    for (const prologue_model::ExpectedBuffer &buffer : expected) {
      names += " " + buffer.name;
      all_same = sameBytes(buffer, workspace) && all_same;
    }
    std::printf("gpu_prologue_test: %-36s d%-3d %-4s %s: %s the model's (%s )\n", variant.name.c_str(), head_dim,
                reference::nameOf(c.storage).data(), reference::nameOf(c.layout).data(),
                all_same ? "same bytes as" : "DIFFERENT from", names.c_str());
    CAPTURE(variant.name);
    CAPTURE(head_dim);
    CHECK(all_same);
    ++checked;
  }
  CHECK(checked >= 20);
}

TEST_CASE("v_codes in the wgmma token order are the natural codes, permuted in groups of 32") {
  if (skipWithoutGpu())
    return;
  driver().ensureContext(); // runners launch in their own context and leave the thread's as it was
  codegen::PrologueOptions interleaved;
  interleaved.v_codes_token_order = schedules::VCodesTokenOrder::wgmma_interleaved_32;
  struct Case {
    const char *preset;
    int head_dim;
    StorageType storage;
    Layout layout;
    int64_t tokens_kv;
  };
  // int8 V (sage-vb), e4m3 V (sage2-fp8; smoothed V where the preset smooths it), a ragged last block each.
  const Case cases[] = {{"sage-vb", 128, StorageType::f16, Layout::hnd, 333},
                        {"sage-vb", 64, StorageType::bf16, Layout::nhd, 1000},
                        {"sage2-fp8", 128, StorageType::bf16, Layout::hnd, 517},
                        {"sage2-fp8", 64, StorageType::f16, Layout::nhd, 64}};
  for (const Case &c : cases) {
    const AttentionVariant variant = dsl::preset(c.preset, c.head_dim)->describe();
    const schedules::InputType input =
        c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
    const schedules::ProblemShape shape{2, 4, 2, 200, c.tokens_kv, c.head_dim};
    const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, shape, input);
    REQUIRE(layout.v_codes.bytes > 0);
    const PrologueProblem problem(shape, c.storage, c.layout);
    const std::vector<unsigned char> natural =
        workspaceAfter(DevicePrologue(variant, input, {}), problem, variant, layout);
    const std::vector<unsigned char> permuted =
        workspaceAfter(DevicePrologue(variant, input, interleaved), problem, variant, layout);
    CAPTURE(c.preset);
    CAPTURE(c.head_dim);
    CAPTURE(c.tokens_kv);
    // v_codes [b * h_kv][d][padded_kv]: position p of a row holds the natural row's token vCodesTokenAt(p).
    const size_t rows = static_cast<size_t>(shape.batch * shape.heads_kv * shape.head_dim);
    const size_t padded_kv = static_cast<size_t>(layout.padded_kv);
    size_t mismatches = 0, nonzero_padding = 0;
    for (size_t row = 0; row < rows; ++row)
      for (size_t p = 0; p < padded_kv; ++p) {
        const size_t base = layout.v_codes.offset + row * padded_kv;
        const auto token =
            static_cast<size_t>(schedules::vCodesTokenAt(interleaved.v_codes_token_order, static_cast<int64_t>(p)));
        mismatches += permuted[base + p] != natural[base + token] ? 1 : 0;
        nonzero_padding += token >= static_cast<size_t>(c.tokens_kv) && permuted[base + p] != 0 ? 1 : 0;
      }
    CHECK(mismatches == 0);
    CHECK(nonzero_padding == 0);
    // Everything else, v_scales and the other operands included, is byte for byte the same.
    std::vector<unsigned char> natural_rest = natural, permuted_rest = permuted;
    std::memset(natural_rest.data() + layout.v_codes.offset, 0, layout.v_codes.bytes);
    std::memset(permuted_rest.data() + layout.v_codes.offset, 0, layout.v_codes.bytes);
    CHECK(natural_rest == permuted_rest);
    std::printf("gpu_prologue_test: %s d%d n_kv %lld: wgmma-ordered v_codes match the natural ones (%zu codes)\n",
                c.preset, c.head_dim, static_cast<long long>(c.tokens_kv), rows * padded_kv);
  }
}

TEST_CASE("the one-pass prologue writes the two launches' bytes, call after call") {
  if (skipWithoutGpu())
    return;
  driver().ensureContext(); // runners launch in their own context and leave the thread's as it was
  codegen::PrologueTunables two_launches;
  two_launches.one_pass = false;
  struct Case {
    const char *preset;
    int head_dim;
    StorageType storage;
    Layout layout;
    schedules::ProblemShape shape;
    int lookahead;
  };
  // One head and many; one slice per head and the most; ragged blocks; GQA; lookahead 0 (tiles right after their
  // own head's statistics) and beyond the head count.
  const Case cases[] = {
      {"sage-b", 128, StorageType::f16, Layout::hnd, {1, 1, 1, 100, 77, 128}, 1},
      {"sage-b", 64, StorageType::bf16, Layout::nhd, {3, 8, 2, 700, 4099, 64}, 1},
      {"sage2-fp8", 128, StorageType::f16, Layout::nhd, {2, 16, 16, 513, 1027, 128}, 1},
      {"sage2-fp8", 128, StorageType::bf16, Layout::hnd, {1, 4, 4, 256, 16384, 128}, 0},
      {"sage-vb", 64, StorageType::f16, Layout::hnd, {4, 6, 3, 333, 2222, 64}, 8},
      {"sage-vt", 128, StorageType::bf16, Layout::nhd, {1, 32, 8, 1000, 3000, 128}, 2},
  };
  for (const Case &c : cases) {
    for (bool rotated : {false, true}) {
      AttentionVariant variant = dsl::preset(c.preset, c.head_dim)->describe();
      if (rotated)
        variant.q.rotation_seed = variant.k.rotation_seed = 5;
      if (rotated && !schedules::prologueRotationSupport(variant).supported)
        continue;
      const schedules::InputType input =
          c.storage == StorageType::bf16 ? schedules::InputType::bf16 : schedules::InputType::f16;
      const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, c.shape, input);
      codegen::PrologueTunables one_pass;
      one_pass.one_pass = true;
      one_pass.one_pass_lookahead_heads = c.lookahead;
      const DevicePrologue fused(variant, input, {}, one_pass), split(variant, input, {}, two_launches);
      REQUIRE(fused.launches() == 1);
      REQUIRE(split.launches() == 2);
      const PrologueProblem problem(c.shape, c.storage, c.layout);
      std::vector<unsigned char> expected = workspaceAfter(split, problem, variant, layout);
      // The counters and the statistics scratch are the launches' own (the one-pass launch also keeps each head's
      // combined statistics there); everything the attention kernel reads must match, on every call.
      const auto without_counters = [&](std::vector<unsigned char> bytes) {
        std::memset(bytes.data() + layout.prologue_counters.offset, 0, layout.prologue_counters.bytes);
        std::memset(bytes.data() + layout.prologue_statistics.offset, 0, layout.prologue_statistics.bytes);
        return bytes;
      };
      expected = without_counters(expected);
      int same = 0;
      constexpr int kCalls = 5;
      for (int call = 0; call < kCalls; ++call)
        same += without_counters(workspaceAfter(fused, problem, variant, layout)) == expected ? 1 : 0;
      CAPTURE(c.preset);
      CAPTURE(c.head_dim);
      CAPTURE(rotated);
      CAPTURE(c.shape.batch * c.shape.heads_kv);
      CAPTURE(c.shape.tokens_kv);
      CHECK(same == kCalls);
      std::printf("gpu_prologue_test: one pass %-9s%s d%-3d b%lld h_kv %2lld n_kv %5lld lookahead %d: %d of %d calls "
                  "byte for byte the two launches'\n",
                  c.preset, rotated ? "-rot" : "    ", c.head_dim, static_cast<long long>(c.shape.batch),
                  static_cast<long long>(c.shape.heads_kv), static_cast<long long>(c.shape.tokens_kv), c.lookahead,
                  same, kCalls);
    }
  }
}

// Microseconds per call of `prologue` (counters cleared on the stream, as the runtime does), after a warm-up.
double microsecondsPerCall(const DevicePrologue &prologue, const schedules::ProblemShape &shape,
                           const schedules::WorkspaceLayout &layout, const SagePrologueParams &params) {
  constexpr int kCalls = 20;
  const runtime::driver::Event start = driver().createEvent(), end = driver().createEvent();
  prologue.run(shape, layout, params);
  driver().recordEvent(start, nullptr);
  for (int call = 0; call < kCalls; ++call)
    prologue.run(shape, layout, params);
  driver().recordEvent(end, nullptr);
  driver().synchronizeEvent(end);
  const double microseconds = 1000.0 * driver().elapsedMilliseconds(start, end) / kCalls;
  driver().destroyEvent(start);
  driver().destroyEvent(end);
  return microseconds;
}

TEST_CASE("prologue tunables sweep (SAGEGEN_PROLOGUE_SWEEP=1)") {
  // A measurement to choose the defaults from, not a check: off unless asked for.
  if (skipWithoutGpu() || std::getenv("SAGEGEN_PROLOGUE_SWEEP") == nullptr)
    return;
  driver().ensureContext();
  struct Candidate {
    std::string name;
    codegen::PrologueTunables tunables;
  };
  std::vector<Candidate> candidates;
  const auto add = [&](const std::string &name, const codegen::PrologueTunables &tunables) {
    candidates.push_back({name, tunables});
  };
  codegen::PrologueTunables tunables;
  add("two launches (default)", tunables);
  tunables.min_ctas_per_sm = 4;
  add("two launches min_ctas_per_sm 4", tunables);
  for (int v_tile : {256}) {
    tunables = {};
    tunables.v_tile_tokens = v_tile;
    add("two launches v_tile_tokens " + std::to_string(v_tile), tunables);
  }
  for (int k_blocks : {1, 4}) {
    tunables = {};
    tunables.k_blocks_per_tile = k_blocks;
    add("two launches k_blocks_per_tile " + std::to_string(k_blocks), tunables);
  }
  for (int lookahead : {1, 4}) {
    tunables = {};
    tunables.one_pass = true;
    tunables.one_pass_lookahead_heads = lookahead;
    add("one pass lookahead " + std::to_string(lookahead), tunables);
  }
  for (const char *preset : {"sage2-fp8", "sage-b"})
    for (int head_dim : {128, 64}) {
      const AttentionVariant variant = dsl::preset(preset, head_dim)->describe();
      std::vector<std::unique_ptr<DevicePrologue>> prologues;
      for (const Candidate &candidate : candidates)
        prologues.push_back(std::make_unique<DevicePrologue>(variant, schedules::InputType::f16,
                                                             codegen::PrologueOptions{}, candidate.tunables));
      const int64_t heads = 2048 / head_dim;
      for (int64_t tokens : {int64_t{1024}, int64_t{4096}, int64_t{16384}}) {
        const schedules::ProblemShape shape{1, heads, heads, tokens, tokens, head_dim};
        const PrologueProblem problem(shape, StorageType::f16, Layout::hnd);
        const schedules::WorkspaceLayout layout =
            schedules::computeWorkspaceLayout(variant, shape, schedules::InputType::f16);
        DeviceBuffer workspace(layout.total_bytes);
        const SagePrologueParams params =
            problem.params(variant, layout, static_cast<unsigned char *>(workspace.get()));
        for (size_t i = 0; i < candidates.size(); ++i)
          std::printf("gpu_prologue_test: sweep %-9s d%-3d N %5lld: %-78s %7.1f us\n", preset, head_dim,
                      static_cast<long long>(tokens), candidates[i].name.c_str(),
                      microsecondsPerCall(*prologues[i], shape, layout, params));
      }
    }
}

TEST_CASE("prologue profile (SAGEGEN_PROLOGUE_PROFILE=1)") {
  // For a profiler (ncu -k regex:sage_prologue --launch-skip 3): sage2-fp8 d128 at 16k tokens x hidden 2048, the two
  // launches and the one-pass launch, each once to warm up and once to profile.
  if (skipWithoutGpu() || std::getenv("SAGEGEN_PROLOGUE_PROFILE") == nullptr)
    return;
  driver().ensureContext();
  const AttentionVariant variant = dsl::preset("sage2-fp8", 128)->describe();
  codegen::PrologueTunables one_pass;
  one_pass.one_pass = true;
  one_pass.one_pass_lookahead_heads = 4;
  const DevicePrologue split(variant, schedules::InputType::f16, {}, {}),
      fused(variant, schedules::InputType::f16, {}, one_pass);
  const schedules::ProblemShape shape{1, 16, 16, 16384, 16384, 128};
  const PrologueProblem problem(shape, StorageType::f16, Layout::hnd);
  const schedules::WorkspaceLayout layout =
      schedules::computeWorkspaceLayout(variant, shape, schedules::InputType::f16);
  DeviceBuffer workspace(layout.total_bytes);
  const SagePrologueParams params = problem.params(variant, layout, static_cast<unsigned char *>(workspace.get()));
  for (int round = 0; round < 2; ++round) {
    split.run(shape, layout, params);
    fused.run(shape, layout, params);
  }
  driver().synchronizeContext();
}

TEST_CASE("prologue time per call at hidden 2048") {
  if (skipWithoutGpu())
    return;
  // GB/s of the compulsory traffic: Q, K (and V where the prologue reads it) once, and the workspace written;
  // the second read of K and V comes on top.
  constexpr int kCalls = 20;
  driver().ensureContext();
  const runtime::driver::Event start = driver().createEvent(), end = driver().createEvent();
  const char *const presets[] = {"sage-b", "sage-b", "sage-vb", "sage2-fp8", "sage2-fp8"};
  const bool one_pass[] = {true, false, true, true, false}; // against the two launches where it matters most
  for (int head_dim : {64, 128}) {
    std::vector<AttentionVariant> variants;
    std::vector<std::unique_ptr<DevicePrologue>> prologues;
    for (size_t i = 0; i < std::size(presets); ++i) {
      variants.push_back(dsl::preset(presets[i], head_dim)->describe());
      codegen::PrologueTunables tunables;
      tunables.one_pass = one_pass[i];
      prologues.push_back(std::make_unique<DevicePrologue>(variants.back(), schedules::InputType::f16,
                                                           codegen::PrologueOptions{}, tunables));
    }
    for (int64_t tokens : {1024, 2048, 4096, 8192, 16384}) {
      const int64_t heads = 2048 / head_dim;
      const schedules::ProblemShape shape{1, heads, heads, tokens, tokens, head_dim};
      const PrologueProblem problem(shape, StorageType::f16, Layout::hnd); // one random Q, K, V for all presets
      for (size_t i = 0; i < variants.size(); ++i) {
        const schedules::WorkspaceLayout layout =
            schedules::computeWorkspaceLayout(variants[i], shape, schedules::InputType::f16);
        DeviceBuffer workspace(layout.total_bytes);
        const SagePrologueParams params =
            problem.params(variants[i], layout, static_cast<unsigned char *>(workspace.get()));
        prologues[i]->run(shape, layout, params); // warm-up
        driver().recordEvent(start, nullptr);
        for (int call = 0; call < kCalls; ++call)
          prologues[i]->run(shape, layout, params);
        driver().recordEvent(end, nullptr);
        driver().synchronizeEvent(end);
        const double microseconds = 1000.0 * driver().elapsedMilliseconds(start, end) / kCalls;
        const bool reads_v =
            codegen::makePrologueConfig(variants[i], schedules::InputType::f16, head_dim, {}).v_output !=
            codegen::VOutput::none;
        const double bytes = (reads_v ? 3.0 : 2.0) * static_cast<double>(heads * tokens * head_dim) * 2.0 +
                             static_cast<double>(layout.total_bytes);
        std::printf("gpu_prologue_test: timing %-9s d%-3d N %5lld heads %2lld: %zu launches %8.1f us/call %7.0f "
                    "GB/s (inputs once + workspace)\n",
                    presets[i], head_dim, static_cast<long long>(tokens), static_cast<long long>(heads),
                    prologues[i]->launches(), microseconds, bytes / microseconds / 1e3);
        CHECK(microseconds > 0.0);
      }
    }
  }
  driver().destroyEvent(start);
  driver().destroyEvent(end);
}
