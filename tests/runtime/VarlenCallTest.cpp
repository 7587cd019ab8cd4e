// validateVarlenCall: a packed call's descriptors checked before any pointer is used (fake addresses, never
// dereferenced); a good call gives the dense problem (batch = sequences, tokens = the maxima), batch stride 0 and the
// sequence offsets the kernels read.
#include "sage/runtime/VarlenCall.h"
#include "sage/runtime/Sm90TensorMaps.h"

#include "../support/RuntimeArguments.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <string>

using namespace sage::runtime;

namespace {

using sage::test::contains;
using sage::test::contiguous;

KernelRequirements requirements(bool writes_lse = true) {
  KernelRequirements r;
  r.head_dim = 64;
  r.input = sage::schedules::InputType::f16;
  r.writes_lse = writes_lse;
  r.block_q = 128;
  r.block_kv = 64;
  r.device = 0;
  return r;
}

// 5 sequences: q [1000, 8, 64], k/v [1500, 2, 64] (GQA 4), lse [8, 1000], maxima 400 and 700.
VarlenCall goodCall() {
  VarlenCall call;
  call.q = contiguous({1000, 8, 64}, 0x10000000);
  call.k = contiguous({1500, 2, 64}, 0x20000000);
  call.v = contiguous({1500, 2, 64}, 0x30000000);
  call.o = contiguous({1000, 8, 64}, 0x40000000);
  call.lse = contiguous({8, 1000}, 0x50000000, DataType::f32);
  call.cu_seqlens_q = contiguous({6}, 0x60000000, DataType::i32);
  call.cu_seqlens_kv = contiguous({6}, 0x60001000, DataType::i32);
  call.max_seqlen_q = 400;
  call.max_seqlen_kv = 700;
  return call;
}

std::string rejection(const std::function<void(VarlenCall &, KernelRequirements &)> &mutate,
                      const std::string &argument) {
  VarlenCall call = goodCall();
  KernelRequirements r = requirements();
  mutate(call, r);
  return sage::test::rejection([&] { validateVarlenCall(call, r); }, argument);
}

} // namespace

TEST_CASE("a good packed call gives the dense problem of its maxima, batch stride 0 and the offsets") {
  const ValidatedCall validated = validateVarlenCall(goodCall(), requirements());
  CHECK(validated.shape == sage::schedules::ProblemShape{5, 8, 2, 400, 700, 64});
  const AttentionTensors &tensors = validated.tensors;
  CHECK(tensors.q_strides.batch == 0);
  CHECK(tensors.q_strides.head == 64);
  CHECK(tensors.q_strides.token == 8 * 64);
  CHECK(tensors.k_strides.token == 2 * 64);
  CHECK(tensors.o_strides.batch == 0);
  CHECK(tensors.sequences.q == reinterpret_cast<const int *>(0x60000000));
  CHECK(tensors.sequences.kv == reinterpret_cast<const int *>(0x60001000));
  CHECK(tensors.sequences.total_q == 1000);
  CHECK(tensors.sequences.total_kv == 1500);
  CHECK(tensors.lse == reinterpret_cast<float *>(0x50000000));
  CHECK(tensors.causal_alignment == CausalAlignment::bottom_right);
}

TEST_CASE("a strided packed Q (a view of a wider tensor) keeps its strides") {
  VarlenCall call = goodCall();
  call.q.strides = {3 * 8 * 64, 64, 1}; // q of a fused [total, 3 * heads, d] projection
  const ValidatedCall validated = validateVarlenCall(call, requirements());
  CHECK(validated.tensors.q_strides.token == 3 * 8 * 64);
  CHECK(validated.tensors.q_strides.head == 64);
}

TEST_CASE("the maxima may exceed every length and the totals (fixed maxima for CUDA graphs)") {
  VarlenCall call = goodCall();
  call.max_seqlen_q = 4096;
  call.max_seqlen_kv = 8192;
  CHECK(validateVarlenCall(call, requirements()).shape.tokens_kv == 8192);
}

TEST_CASE("the packed tensors are 3-D [total, heads, head_dim] of the kernel's dtype") {
  CHECK(contains(rejection(
                     [](VarlenCall &c, KernelRequirements &) {
                       c.q = contiguous({1, 1000, 8, 64}, 0x10000000);
                     },
                     "q"),
                 "3"));
  CHECK(contains(rejection([](VarlenCall &c, KernelRequirements &) { c.k.dtype = DataType::bf16; }, "k"), "f16"));
  CHECK(contains(rejection(
                     [](VarlenCall &c, KernelRequirements &) {
                       c.v = contiguous({1500, 2, 32}, 0x30000000);
                     },
                     "v"),
                 "64"));
  rejection([](VarlenCall &c, KernelRequirements &) { c.o = contiguous({999, 8, 64}, 0x40000000); }, "o");
  CHECK(contains(rejection(
                     [](VarlenCall &c, KernelRequirements &) {
                       c.k = contiguous({1500, 3, 64}, 0x20000000);
                     },
                     "k"),
                 "divide"));
  rejection([](VarlenCall &c, KernelRequirements &) { c.q.strides = {8 * 64, 64, 2}; }, "q");
}

TEST_CASE("cu_seqlens are int32 1-D [batch + 1], contiguous, on the kernels' device, of one length") {
  CHECK(contains(
      rejection([](VarlenCall &c, KernelRequirements &) { c.cu_seqlens_q.dtype = DataType::f32; }, "cu_seqlens_q"),
      "i32"));
  rejection(
      [](VarlenCall &c, KernelRequirements &) {
        c.cu_seqlens_kv = contiguous({2, 3}, 0x60001000, DataType::i32);
      },
      "cu_seqlens_kv");
  CHECK(contains(rejection([](VarlenCall &c,
                              KernelRequirements &) { c.cu_seqlens_q = contiguous({1}, 0x60000000, DataType::i32); },
                           "cu_seqlens_q"),
                 "batch + 1"));
  CHECK(contains(rejection([](VarlenCall &c,
                              KernelRequirements &) { c.cu_seqlens_kv = contiguous({5}, 0x60001000, DataType::i32); },
                           "cu_seqlens_kv"),
                 "6 entries"));
  rejection([](VarlenCall &c, KernelRequirements &) { c.cu_seqlens_q.strides[0] = 2; }, "cu_seqlens_q");
  rejection([](VarlenCall &c, KernelRequirements &) { c.cu_seqlens_q.device = kHostMemory; }, "cu_seqlens_q");
  // Written tensors must not overlap the offsets.
  rejection([](VarlenCall &c, KernelRequirements &) { c.cu_seqlens_kv.data = c.o.data; }, "o");
}

TEST_CASE("the maxima lie in [1, the kernels' 32-bit limit]") {
  CHECK(contains(rejection([](VarlenCall &c, KernelRequirements &) { c.max_seqlen_q = 0; }, "max_seqlen_q"),
                 "upper bound"));
  rejection([](VarlenCall &c, KernelRequirements &) { c.max_seqlen_kv = -3; }, "max_seqlen_kv");
  rejection([](VarlenCall &c, KernelRequirements &) { c.max_seqlen_kv = int64_t(1) << 31; }, "max_seqlen_kv");
}

TEST_CASE("the LSE is f32 [heads_q, total_q], contiguous, and required iff the kernel writes it") {
  CHECK(contains(rejection(
                     [](VarlenCall &c, KernelRequirements &) {
                       c.lse = contiguous({1000, 8}, 0x50000000, DataType::f32);
                     },
                     "lse"),
                 "[8, 1000]"));
  rejection(
      [](VarlenCall &c, KernelRequirements &) {
        c.lse = contiguous({1, 8, 1000}, 0x50000000, DataType::f32);
      },
      "lse");
  rejection([](VarlenCall &c, KernelRequirements &) { c.lse->strides = {1, 8}; }, "lse");
  CHECK(contains(rejection([](VarlenCall &c, KernelRequirements &) { c.lse.reset(); }, "lse"), "writes the LSE"));
  rejection([](VarlenCall &, KernelRequirements &r) { r.writes_lse = false; }, "lse");
}

TEST_CASE("the dense problem of a packed call: sequences and maxima checked by name") {
  CHECK(varlenProblemShape(3, 8, 2, 100, 200, requirements()) == sage::schedules::ProblemShape{3, 8, 2, 100, 200, 64});
  sage::test::rejection([] { varlenProblemShape(0, 8, 2, 100, 200, requirements()); }, "cu_seqlens_q");
  sage::test::rejection([] { varlenProblemShape(70000, 8, 2, 100, 200, requirements()); }, "cu_seqlens_q");
  sage::test::rejection([] { varlenProblemShape(3, 8, 3, 100, 200, requirements()); }, "k");
  sage::test::rejection([] { varlenProblemShape(3, 8, 2, 100, 0, requirements()); }, "max_seqlen_kv");
}

TEST_CASE("sm90 reads a packed V in place as [1][h_kv][total_kv][d]: batch stride 0 is no problem there") {
  sage::schedules::KernelPlan plan;
  plan.v_source = sage::schedules::ValueSource::input;
  plan.head_dim = 64;
  const ValidatedCall validated = validateVarlenCall(goodCall(), requirements());
  const ValueTensor v{validated.tensors.v, validated.tensors.v_strides};
  // Dense plans read V over the problem's shape: the packed V's batch stride 0 would be refused there.
  CHECK(valueTensorShape(plan, validated.shape, validated.tensors.sequences) == validated.shape);
  CHECK_FALSE(valueTensorProblem(plan, validated.shape, v).empty());
  plan.packed_sequences = true;
  const sage::schedules::ProblemShape shape = valueTensorShape(plan, validated.shape, validated.tensors.sequences);
  CHECK(shape == sage::schedules::ProblemShape{1, 8, 2, 400, 1500, 64});
  CHECK(valueTensorProblem(plan, shape, v).empty());
  // No keys at all: one token, so that the map stays valid (it is never read).
  CHECK(valueTensorShape(plan, validated.shape, {nullptr, nullptr, 0, 0}).tokens_kv == 1);
}
