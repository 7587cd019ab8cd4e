// validateAttentionCall: every bad call is an ArgumentError naming the argument, before any pointer is used (the
// pointers here are fake addresses that are never dereferenced). A good call gives the kernels' shape and strides.
#include "sage/runtime/AttentionCall.h"

#include "../support/RuntimeArguments.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>

using namespace sage::runtime;

namespace {

const void *address(uintptr_t value) { return reinterpret_cast<const void *>(value); }

using sage::test::contiguous;

KernelRequirements requirements() {
  KernelRequirements r;
  r.head_dim = 64;
  r.input = sage::schedules::InputType::f16;
  r.block_q = 128;
  r.block_kv = 64;
  r.device = 0;
  return r;
}

// q [2, 8, 300, 64], k/v [2, 2, 500, 64] (GQA 4), o like q: HND, far apart in memory.
AttentionCall goodCall() {
  AttentionCall call;
  call.q = contiguous({2, 8, 300, 64}, 0x10000000);
  call.k = contiguous({2, 2, 500, 64}, 0x20000000);
  call.v = contiguous({2, 2, 500, 64}, 0x30000000);
  call.o = contiguous({2, 8, 300, 64}, 0x40000000);
  return call;
}

// The message of the ArgumentError `mutate` provokes, checked to name `argument` first.
std::string rejection(const std::function<void(AttentionCall &, KernelRequirements &)> &mutate,
                      const std::string &argument) {
  AttentionCall call = goodCall();
  KernelRequirements r = requirements();
  mutate(call, r);
  return sage::test::rejection([&] { validateAttentionCall(call, r); }, argument);
}

using sage::test::contains;

} // namespace

TEST_CASE("a good call gives the problem shape and the kernels' strides") {
  const ValidatedCall validated = validateAttentionCall(goodCall(), requirements());
  CHECK(validated.shape == sage::schedules::ProblemShape{2, 8, 2, 300, 500, 64}); // batch, heads q, kv, tokens q, kv, d
  CHECK(validated.tensors.q == address(0x10000000));
  CHECK(validated.tensors.k_strides.batch == 2 * 500 * 64);
  CHECK(validated.tensors.k_strides.head == 500 * 64);
  CHECK(validated.tensors.k_strides.token == 64);
  CHECK(validated.tensors.lse == nullptr);
  CHECK(validated.tensors.block_mask == nullptr);
}

TEST_CASE("NHD: heads and tokens swap places, strides follow") {
  AttentionCall call;
  call.layout = TensorLayout::nhd;
  call.q = contiguous({1, 300, 8, 64}, 0x10000000);
  call.k = contiguous({1, 500, 8, 64}, 0x20000000);
  call.v = contiguous({1, 500, 8, 64}, 0x30000000);
  call.o = contiguous({1, 300, 8, 64}, 0x40000000);
  const ValidatedCall validated = validateAttentionCall(call, requirements());
  CHECK(validated.shape.heads_q == 8);
  CHECK(validated.shape.tokens_q == 300);
  CHECK(validated.tensors.q_strides.head == 64);
  CHECK(validated.tensors.q_strides.token == 8 * 64);
  CHECK(validated.tensors.q_strides.batch == 0); // batch of 1: its stride is never used
}

TEST_CASE("the head dim must be the kernel's") {
  const std::string message = rejection([](AttentionCall &c, KernelRequirements &) { c.q.shape[3] = 128; }, "q");
  CHECK(contains(message, "head_dim 64"));
  rejection([](AttentionCall &, KernelRequirements &r) { r.head_dim = 128; }, "q");
}

TEST_CASE("dtypes: q, k, v and o must be the kernel's storage type") {
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.q.dtype = DataType::bf16; }, "q"),
                 "expected dtype f16, got bf16"));
  rejection([](AttentionCall &c, KernelRequirements &) { c.k.dtype = DataType::f32; }, "k");
  rejection([](AttentionCall &c, KernelRequirements &) { c.v.dtype = DataType::bf16; }, "v");
  rejection([](AttentionCall &c, KernelRequirements &) { c.o.dtype = DataType::f32; }, "o");
  rejection([](AttentionCall &, KernelRequirements &r) { r.input = sage::schedules::InputType::bf16; }, "q");
}

TEST_CASE("shapes must agree: batch, k and v, GQA, o") {
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.k.shape[0] = 3; }, "k"), "batch is 3"));
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.v.shape[2] = 499; }, "v"), "k's"));
  rejection([](AttentionCall &c, KernelRequirements &) { c.v.shape[1] = 1; }, "v");
  CHECK(contains(rejection(
                     [](AttentionCall &c, KernelRequirements &) {
                       c.k.shape[1] = c.v.shape[1] = 3;
                       c.k.strides = c.v.strides = {3 * 500 * 64, 500 * 64, 64, 1};
                     },
                     "k"),
                 "must divide"));
  rejection([](AttentionCall &c, KernelRequirements &) { c.o.shape[2] = 299; }, "o");
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.rank = 3; }, "q");
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.shape[2] = 0; }, "q");
}

TEST_CASE("devices: every tensor on the kernels' device, none in host memory") {
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.v.device = kHostMemory; }, "v"),
                 "host memory"));
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.o.device = 1; }, "o"), "CUDA device 1"));
  rejection([](AttentionCall &, KernelRequirements &r) { r.device = 1; }, "q");
}

TEST_CASE("alignment and strides the kernels need") {
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.data = address(0x10000008); }, "q");
  rejection([](AttentionCall &c, KernelRequirements &) { c.k.strides[2] = 68; }, "k");
  rejection([](AttentionCall &c, KernelRequirements &) { c.v.strides[3] = 2; }, "v");
  rejection([](AttentionCall &c, KernelRequirements &) { c.o.data = address(0x40000002); }, "o");
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.strides[1] = -64; }, "q");
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.data = nullptr; }, "q");
}

TEST_CASE("o must not overlap itself or the inputs") {
  rejection([](AttentionCall &c, KernelRequirements &) { c.o.strides[1] = 0; }, "o");
  CHECK(contains(rejection([](AttentionCall &c, KernelRequirements &) { c.o.data = c.q.data; }, "o"), "overlaps q"));
}

TEST_CASE("the overlap rule covers lse and the block mask too (issue 26)") {
  auto with_lse = [](AttentionCall &c, KernelRequirements &r, uintptr_t at) {
    r.writes_lse = true;
    c.lse = contiguous({2, 8, 300}, at, DataType::f32);
  };
  CHECK(contains(rejection([&](AttentionCall &c, KernelRequirements &r) { with_lse(c, r, 0x30000000); }, "lse"),
                 "overlaps v"));
  CHECK(contains(rejection([&](AttentionCall &c, KernelRequirements &r) { with_lse(c, r, 0x20000100); }, "lse"),
                 "overlaps k"));
  CHECK(contains(rejection([&](AttentionCall &c, KernelRequirements &r) { with_lse(c, r, 0x40000040); }, "lse"),
                 "overlaps o"));
  CHECK(contains(rejection(
                     [](AttentionCall &c, KernelRequirements &r) {
                       r.block_sparse = true;
                       c.block_mask = contiguous({2, 8, 3, 8}, 0x40000010, DataType::u8);
                     },
                     "o"),
                 "overlaps block_mask"));
  // Inputs may alias one another: k = v.
  AttentionCall call = goodCall();
  call.v.data = call.k.data;
  CHECK_NOTHROW(validateAttentionCall(call, requirements()));
  // The regions come back for the workspace check.
  CHECK(validateAttentionCall(goodCall(), requirements()).regions.size() == 4);
}

TEST_CASE("lse: required exactly when the kernel writes it, f32 [b, h_q, n_q] contiguous") {
  rejection([](AttentionCall &, KernelRequirements &r) { r.writes_lse = true; }, "lse");
  auto lse = [](AttentionCall &c) { c.lse = contiguous({2, 8, 300}, 0x50000000, DataType::f32); };
  rejection([&](AttentionCall &c, KernelRequirements &) { lse(c); }, "lse"); // the kernel does not write it
  AttentionCall call = goodCall();
  KernelRequirements r = requirements();
  r.writes_lse = true;
  lse(call);
  CHECK(validateAttentionCall(call, r).tensors.lse != nullptr);
  rejection(
      [&](AttentionCall &c, KernelRequirements &r2) {
        r2.writes_lse = true;
        lse(c);
        c.lse->dtype = DataType::f16;
      },
      "lse");
  rejection(
      [&](AttentionCall &c, KernelRequirements &r2) {
        r2.writes_lse = true;
        lse(c);
        c.lse->shape[2] = 299;
      },
      "lse");
  rejection(
      [&](AttentionCall &c, KernelRequirements &r2) {
        r2.writes_lse = true;
        lse(c);
        c.lse->strides = {1, 2 * 300, 2, 0};
      },
      "lse");
}

TEST_CASE("block_mask: u8/bool [b, h_q, ceil(n_q / block_q), ceil(n_kv / block_kv)] for block-sparse kernels") {
  const auto mask = [](AttentionCall &c, int64_t q_blocks, int64_t kv_blocks) {
    c.block_mask = contiguous({2, 8, q_blocks, kv_blocks}, 0x60000000, DataType::u8);
  };
  rejection([&](AttentionCall &c, KernelRequirements &) { mask(c, 3, 8); }, "block_mask"); // not block-sparse
  AttentionCall call = goodCall();
  KernelRequirements r = requirements();
  r.block_sparse = true;
  mask(call, 3, 8); // ceil(300 / 128), ceil(500 / 64)
  CHECK(validateAttentionCall(call, r).tensors.block_mask != nullptr);
  call.block_mask->dtype = DataType::boolean;
  CHECK_NOTHROW(validateAttentionCall(call, r));
  CHECK(contains(rejection(
                     [&](AttentionCall &c, KernelRequirements &r2) {
                       r2.block_sparse = true;
                       mask(c, 3, 7);
                     },
                     "block_mask"),
                 "[2, 8, 3, 8]"));
  rejection(
      [&](AttentionCall &c, KernelRequirements &r2) {
        r2.block_sparse = true;
        mask(c, 3, 8);
        c.block_mask->dtype = DataType::f32;
      },
      "block_mask");
}

TEST_CASE("limits: the launch grid and 32-bit token counts") {
  rejection(
      [](AttentionCall &c, KernelRequirements &) { c.q.shape[0] = c.k.shape[0] = c.v.shape[0] = c.o.shape[0] = 70000; },
      "q");
  rejection([](AttentionCall &c, KernelRequirements &) { c.k.shape[2] = c.v.shape[2] = int64_t(1) << 31; }, "k");
  // Sizes whose extent overflows 64 bits are refused, not wrapped.
  rejection([](AttentionCall &c, KernelRequirements &) { c.q.strides[0] = int64_t(1) << 62; }, "q");
}

TEST_CASE("causal alignment: the offset each rule gives") {
  CHECK(causalOffset(CausalAlignment::bottom_right, 100, 300) == 200);
  CHECK(causalOffset(CausalAlignment::top_left, 100, 300) == 0);
  CHECK(causalOffset(CausalAlignment::bottom_right, 300, 100) == -200);
  AttentionCall call = goodCall();
  call.causal_alignment = CausalAlignment::top_left;
  CHECK(validateAttentionCall(call, requirements()).tensors.causal_alignment == CausalAlignment::top_left);
}
