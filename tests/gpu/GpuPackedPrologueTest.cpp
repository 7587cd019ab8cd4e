// The packed (variable-length) quantization prologue on the GPU (issue 28): a
// packed call's batch slot b holds, byte for byte, what the dense prologue writes for sequence b alone, in the
// dense workspace layout padded to the call's maximum lengths:
//  - rows (and scale groups, Q blocks, v_codes columns, delta_s entries) that the dense call of sequence b has: the
//    same bytes;
//  - the rest of the slot, up to the maxima: zero (zero codes, zero scales, zero means);
//  - a slot whose two sequences are empty: all zero (mean 0, scales 0: no 0/0).
// The statistics' f32 sums are cut into slices whose count depends on the call's shape, so both runs take tunables
// that give every sequence the same slice count (one slice, or four on sequences of at least 49 keys).
// Offsets out of range (negative, past the totals, decreasing) must not fault. The launches run straight from
// PrologueGenerator's output. Without a GPU the program reports itself skipped (tests/support/GpuTestMain.cpp).
#include "DevicePrologue.h"
#include "sage/dsl/Presets.h"
#include "sage/numerics/Quantizers.h"
#include "sage/reference/HostTensor.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

using namespace sage;
using reference::HostTensor;
using reference::StorageType;
using schedules::InputType;

namespace {

using test::DeviceBuffer;
using test::DevicePrologue;
using test::driver;

std::unique_ptr<DeviceBuffer> upload(const void *data, size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  if (bytes > 0)
    driver().copyToDevice(buffer->pointer, data, bytes);
  return buffer;
}

uint16_t bitsOf(float value, StorageType storage) {
  return storage == StorageType::bf16 ? numerics::floatToBfloat16Bits(value) : numerics::floatToHalfBits(value);
}

// A buffer of the workspace per batch slot: `heads` x `rows` rows of `row_bytes` bytes, where rows and row_bytes grow
// with the padded token counts (the prefix of a longer slot's rows and rows' bytes is a shorter call's).
struct SlotView {
  const char *name;
  schedules::BufferSlice slice;
  int64_t heads, rows, row_bytes;
};

std::vector<SlotView> slotViews(const schedules::WorkspaceLayout &layout, const AttentionVariant &variant,
                                const schedules::ProblemShape &shape) {
  const int64_t q_blocks = layout.padded_q / variant.block_q;
  const auto view = [&](const char *name, const schedules::BufferSlice &slice, int64_t heads, int64_t rows) {
    const int64_t per_head = static_cast<int64_t>(slice.bytes) / (shape.batch * heads);
    return SlotView{name, slice, heads, rows, rows > 0 ? per_head / rows : 0};
  };
  const int64_t d = shape.head_dim;
  std::vector<SlotView> views = {
      view("q_codes", layout.q_codes, shape.heads_q, layout.padded_q),
      view("q_scales", layout.q_scales, shape.heads_q, 1),
      view("k_codes", layout.k_codes, shape.heads_kv, layout.padded_kv),
      view("k_scales", layout.k_scales, shape.heads_kv, 1),
      view("k_mean", layout.k_mean, shape.heads_kv, 1),
      view("q_mean", layout.q_mean, shape.heads_q, 1),
      view("v_values", layout.v_values, shape.heads_kv, layout.padded_kv),
      view("v_codes", layout.v_codes, shape.heads_kv, d),
      view("v_scales", layout.v_scales, shape.heads_kv, 1),
      view("v_mean", layout.v_mean, shape.heads_kv, 1),
      view("delta_s", layout.delta_s, shape.heads_q, q_blocks),
  };
  std::erase_if(views, [](const SlotView &v) { return v.slice.bytes == 0; });
  return views;
}

// One packed call: per sequence its Q, K and V (HND, batch 1), and the packed tensors [total, heads, d] with the
// offsets, on the device.
struct PackedProblem {
  int64_t heads_q, heads_kv, head_dim;
  StorageType storage;
  std::vector<int> cu_q{0}, cu_kv{0};
  std::vector<std::unique_ptr<HostTensor>> q, k, v; // null for an empty sequence
  std::unique_ptr<DeviceBuffer> q_device, k_device, v_device, cu_q_device, cu_kv_device;

  PackedProblem(const std::vector<int> &lengths_q, const std::vector<int> &lengths_kv, int64_t hq, int64_t hkv,
                int64_t d, StorageType type)
      : heads_q(hq), heads_kv(hkv), head_dim(d), storage(type) {
    uint64_t seed = 100;
    for (size_t b = 0; b < lengths_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + lengths_q[b]);
      cu_kv.push_back(cu_kv.back() + lengths_kv[b]);
      const auto make = [&](int64_t heads, int tokens, reference::RandomTensorOptions options) {
        options.seed = seed++;
        return tokens > 0 ? std::make_unique<HostTensor>(
                                reference::randomTensor(1, heads, tokens, d, storage, reference::Layout::hnd, options))
                          : nullptr;
      };
      q.push_back(make(heads_q, lengths_q[b], {}));
      k.push_back(make(heads_kv, lengths_kv[b], {0, 0.0, 1.0, 3.0})); // K's shared channel bias (paper 4.2)
      v.push_back(make(heads_kv, lengths_kv[b], {0, 0.5, 1.0}));      // V off zero, for V smoothing
    }
    q_device = packed(q, cu_q, heads_q);
    k_device = packed(k, cu_kv, heads_kv);
    v_device = packed(v, cu_kv, heads_kv);
    cu_q_device = upload(cu_q.data(), cu_q.size() * 4);
    cu_kv_device = upload(cu_kv.data(), cu_kv.size() * 4);
  }

  int64_t batch() const { return static_cast<int64_t>(q.size()); }
  int maxOf(const std::vector<int> &cu) const {
    int longest = 1; // a shape needs positive token counts
    for (size_t b = 0; b + 1 < cu.size(); ++b)
      longest = std::max(longest, cu[b + 1] - cu[b]);
    return longest;
  }
  schedules::ProblemShape shape() const { return {batch(), heads_q, heads_kv, maxOf(cu_q), maxOf(cu_kv), head_dim}; }
  int lengthQ(size_t b) const { return cu_q[b + 1] - cu_q[b]; }
  int lengthKv(size_t b) const { return cu_kv[b + 1] - cu_kv[b]; }

  // [total, heads, d]: row cu[b] + t of head h is sequence b's token t.
  std::unique_ptr<DeviceBuffer> packed(const std::vector<std::unique_ptr<HostTensor>> &parts,
                                       const std::vector<int> &cu, int64_t heads) const {
    std::vector<uint16_t> bits(static_cast<size_t>(std::max(cu.back(), 1) * heads * head_dim), 0);
    for (size_t b = 0; b < parts.size(); ++b)
      if (parts[b])
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t t = 0; t < parts[b]->tokens(); ++t)
            for (int64_t c = 0; c < head_dim; ++c)
              bits[((cu[b] + t) * heads + h) * head_dim + c] = bitsOf(parts[b]->at(0, h, t, c), storage);
    return upload(bits.data(), bits.size() * 2);
  }

  SagePrologueParams packedParams(const AttentionVariant &packed_variant,
                                  const schedules::WorkspaceLayout &layout) const {
    // The workspace pointer is only checked here (DevicePrologue::workspaceAfter passes its own): any 256-byte aligned
    // value.
    SagePrologueParams params = codegen::makePrologueParams(
        packed_variant, shape(), layout, {q_device->get(), {0, head_dim, heads_q * head_dim}},
        {k_device->get(), {0, head_dim, heads_kv * head_dim}}, {v_device->get(), {0, head_dim, heads_kv * head_dim}},
        reinterpret_cast<unsigned char *>(uintptr_t{256}));
    params.sequences = {static_cast<const int *>(cu_q_device->get()), static_cast<const int *>(cu_kv_device->get()),
                        cu_q.back(), cu_kv.back()};
    return params;
  }
};

// The dense prologue on sequence b alone: its workspace and layout.
struct DenseRun {
  schedules::ProblemShape shape;
  schedules::WorkspaceLayout layout;
  std::vector<unsigned char> workspace;
};

DenseRun runDense(const DevicePrologue &prologue, const AttentionVariant &variant, InputType input,
                  const PackedProblem &problem, size_t b) {
  DenseRun run;
  run.shape = {1, problem.heads_q, problem.heads_kv, problem.lengthQ(b), problem.lengthKv(b), problem.head_dim};
  run.layout = schedules::computeWorkspaceLayout(variant, run.shape, input);
  const auto device = [&](const HostTensor &tensor) {
    std::vector<uint16_t> bits(tensor.values().size());
    for (size_t i = 0; i < bits.size(); ++i)
      bits[i] = bitsOf(tensor.values()[i], problem.storage);
    return upload(bits.data(), bits.size() * 2);
  };
  const auto q = device(*problem.q[b]), k = device(*problem.k[b]), v = device(*problem.v[b]);
  const auto strides = [&](const HostTensor &tensor) {
    return SageTensorStrides{tensor.heads() * tensor.tokens() * tensor.dim(), tensor.tokens() * tensor.dim(),
                             tensor.dim()};
  };
  const SagePrologueParams params = codegen::makePrologueParams(
      variant, run.shape, run.layout, {q->get(), strides(*problem.q[b])}, {k->get(), strides(*problem.k[b])},
      {v->get(), strides(*problem.v[b])}, reinterpret_cast<unsigned char *>(uintptr_t{256}));
  run.workspace = prologue.workspaceAfter(run.shape, run.layout, params);
  return run;
}

// Slot b of the packed workspace against the dense run of sequence b (or against zero when `dense` is null); prints
// the first differences. Returns the number of bytes that differ.
size_t compareSlot(const std::vector<SlotView> &packed_views, const std::vector<unsigned char> &packed, size_t b,
                   const std::vector<SlotView> *dense_views, const std::vector<unsigned char> *dense) {
  size_t differences = 0;
  for (size_t i = 0; i < packed_views.size(); ++i) {
    const SlotView &p = packed_views[i];
    const SlotView *d = dense_views ? &(*dense_views)[i] : nullptr;
    size_t buffer_differences = 0;
    for (int64_t h = 0; h < p.heads; ++h)
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t c = 0; c < p.row_bytes; ++c) {
          const size_t at = p.slice.offset + static_cast<size_t>(((b * p.heads + h) * p.rows + r) * p.row_bytes + c);
          const bool in_dense = d != nullptr && r < d->rows && c < d->row_bytes;
          const unsigned char expected =
              in_dense ? (*dense)[d->slice.offset + static_cast<size_t>((h * d->rows + r) * d->row_bytes + c)] : 0;
          if (packed[at] != expected && buffer_differences++ < 3)
            std::printf("gpu_packed_prologue_test:   slot %zu %s head %lld row %lld byte %lld: packed 0x%02x, %s "
                        "0x%02x\n",
                        b, p.name, static_cast<long long>(h), static_cast<long long>(r), static_cast<long long>(c),
                        packed[at], in_dense ? "dense" : "zero", expected);
        }
    if (buffer_differences > 0)
      std::printf("gpu_packed_prologue_test:   slot %zu %s: %zu bytes differ\n", b, p.name, buffer_differences);
    differences += buffer_differences;
  }
  return differences;
}

struct Case {
  const char *preset;
  int head_dim;
  StorageType storage;
  bool rotated;
};

void checkSlotsAgainstDense(const std::vector<int> &lengths_q, const std::vector<int> &lengths_kv,
                            const codegen::PrologueTunables &tunables, const char *what) {
  const Case cases[] = {{"sage-b", 128, StorageType::f16, false},     {"sage-b", 64, StorageType::bf16, false},
                        {"sage-t", 128, StorageType::bf16, false},    {"sage-vb", 64, StorageType::f16, false},
                        {"sage-vt", 128, StorageType::f16, false},    {"sage2-fp8", 128, StorageType::f16, false},
                        {"sage2-fp8", 64, StorageType::bf16, true},   {"sage2-int4", 128, StorageType::f16, false},
                        {"sage2-int4", 64, StorageType::bf16, false}, {"exact", 128, StorageType::bf16, false}};
  for (const Case &c : cases) {
    AttentionVariant dense = dsl::preset(c.preset, c.head_dim)->describe();
    if (c.rotated)
      dense.q.rotation_seed = dense.k.rotation_seed = 31;
    const AttentionVariant packed = packedSequencesOf(dense);
    const InputType input = c.storage == StorageType::bf16 ? InputType::bf16 : InputType::f16;
    const PackedProblem problem(lengths_q, lengths_kv, 8, 2, c.head_dim, c.storage);
    const schedules::ProblemShape shape = problem.shape();
    const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(packed, shape, input);
    const DevicePrologue packed_prologue(packed, input, {}, tunables), dense_prologue(dense, input, {}, tunables);
    const std::vector<unsigned char> workspace =
        packed_prologue.workspaceAfter(shape, layout, problem.packedParams(packed, layout));
    const std::vector<SlotView> packed_views = slotViews(layout, packed, shape);
    for (size_t b = 0; b < lengths_q.size(); ++b) {
      CAPTURE(c.preset);
      CAPTURE(c.head_dim);
      CAPTURE(c.rotated);
      CAPTURE(b);
      size_t differences = 0;
      if (problem.lengthQ(b) > 0 && problem.lengthKv(b) > 0) {
        const DenseRun run = runDense(dense_prologue, dense, input, problem, b);
        const std::vector<SlotView> dense_views = slotViews(run.layout, dense, run.shape);
        REQUIRE(dense_views.size() == packed_views.size());
        differences = compareSlot(packed_views, workspace, b, &dense_views, &run.workspace);
      } else {
        REQUIRE((problem.lengthQ(b) == 0 && problem.lengthKv(b) == 0)); // the cases below pair empty sequences
        differences = compareSlot(packed_views, workspace, b, nullptr, nullptr);
      }
      std::printf("gpu_packed_prologue_test: %s: %-10s%s d%-3d %-4s slot %zu (n_q %4d, n_kv %4d): %s\n", what, c.preset,
                  c.rotated ? "-rot" : "    ", c.head_dim, reference::nameOf(c.storage).data(), b, problem.lengthQ(b),
                  problem.lengthKv(b),
                  differences == 0 ? "same bytes as the dense call of the sequence alone" : "DIFFERENT");
      CHECK(differences == 0);
    }
  }
}

} // namespace

TEST_CASE("packed slots hold the dense prologue's bytes of each sequence alone (one statistics slice)") {
  driver().ensureContext();
  codegen::PrologueTunables one_slice;
  one_slice.max_statistics_slices = 1;
  // Ragged lengths, a one-token sequence, an empty pair, a sequence of exactly one block, the longest last.
  checkSlotsAgainstDense({37, 1, 0, 128, 300}, {500, 77, 0, 64, 1001}, one_slice, "one slice");
}

TEST_CASE("packed slots hold the dense prologue's bytes of each sequence alone (four statistics slices)") {
  driver().ensureContext();
  // Four slices of a slot's own tokens in both calls: every key sequence has at least 49 tokens.
  codegen::PrologueTunables four_slices;
  four_slices.statistics_target_ctas = 4096;
  four_slices.statistics_min_slice_tokens = 16;
  four_slices.max_statistics_slices = 4;
  checkSlotsAgainstDense({200, 0, 129, 64}, {49, 0, 2999, 640}, four_slices, "four slices");
}

TEST_CASE("offsets out of range are clamped: the prologue finishes without a fault") {
  driver().ensureContext();
  const AttentionVariant dense = dsl::preset("sage2-fp8", 128)->describe();
  const AttentionVariant packed = packedSequencesOf(dense);
  const PackedProblem problem({100, 50, 70}, {300, 20, 90}, 4, 4, 128, StorageType::f16);
  const schedules::ProblemShape shape = problem.shape();
  const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(packed, shape, InputType::f16);
  SagePrologueParams params = problem.packedParams(packed, layout);
  // Negative, decreasing and past the totals, on device memory of the right size.
  const std::vector<int> bad_q = {-40, 1000000, 3, 250}, bad_kv = {500, -7, 100000, 2};
  const auto cu_q = upload(bad_q.data(), 16), cu_kv = upload(bad_kv.data(), 16);
  params.sequences.q = static_cast<const int *>(cu_q->get());
  params.sequences.kv = static_cast<const int *>(cu_kv->get());
  const std::vector<unsigned char> workspace =
      DevicePrologue(packed, InputType::f16, {}).workspaceAfter(shape, layout, params);
  CHECK(workspace.size() == layout.total_bytes); // run() synchronized: a fault would have thrown
  std::printf("gpu_packed_prologue_test: offsets out of range: the prologue finished (run it under compute-sanitizer "
              "to check every access)\n");
}
