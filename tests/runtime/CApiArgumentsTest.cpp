// The C ABI's argument checks for the backward and SLA entry points (the forward's are AttentionCallTest's), without a
// GPU: sage_backward_run, sage_backward_workspace_bytes, sage_sla_forward, sage_sla_backward and sage_sla_workspace
// call exactly these functions before any driver call. The pointers are fake addresses that are never dereferenced.
#include "sage/runtime/CApiArguments.h"

#include "../support/RuntimeArguments.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace sage::runtime;
using namespace sage::runtime::capi;

namespace {

void *address(uintptr_t value) { return reinterpret_cast<void *>(value); }

sage_tensor_desc tensor(std::vector<long long> shape, uintptr_t at, sage_dtype dtype) {
  sage_tensor_desc desc{};
  desc.data = address(at);
  desc.ndim = static_cast<int>(shape.size());
  long long stride = 1;
  for (int i = desc.ndim - 1; i >= 0; --i) {
    desc.shape[i] = shape[static_cast<size_t>(i)];
    desc.strides[i] = stride;
    stride *= shape[static_cast<size_t>(i)];
  }
  desc.dtype = dtype;
  desc.device = 0;
  return desc;
}

using sage::test::contains;
using sage::test::rejection;

// ---- backward: q, o, d_o, d_q [2, 4, 100, 64]; k, v, d_k, d_v [2, 2, 80, 64]; lse f32 [2, 4, 100] ------------------
constexpr uintptr_t kMiB = 1 << 20;

struct BackwardCall {
  sage_tensor_desc q = tensor({2, 4, 100, 64}, 1 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc k = tensor({2, 2, 80, 64}, 2 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc v = tensor({2, 2, 80, 64}, 3 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc o = tensor({2, 4, 100, 64}, 4 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc d_o = tensor({2, 4, 100, 64}, 5 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc lse = tensor({2, 4, 100}, 6 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc d_q = tensor({2, 4, 100, 64}, 7 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc d_k = tensor({2, 2, 80, 64}, 8 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc d_v = tensor({2, 2, 80, 64}, 9 * kMiB, SAGE_DTYPE_F16);
  float softmax_scale = 0.0f;

  sage_backward_args args() const {
    return {&q, &k, &v, &o, &d_o, &lse, &d_q, &d_k, &d_v, softmax_scale, address(10 * kMiB), 0, nullptr};
  }
};

BackwardRequirements backwardRequirements() { return {64, DataType::f16, 0}; }

std::string backwardRejection(const std::function<void(BackwardCall &)> &mutate, const std::string &argument) {
  BackwardCall call;
  mutate(call);
  return rejection([&] { validateBackwardArgs(call.args(), backwardRequirements()); }, argument);
}

// ---- SLA: q, o_sparse (f16), o_linear, d_sparse, d_linear, dq (f32) [1, 4, 256, 64]; k, v (f16), dk, dv (f32)
// [1, 2, 256, 64] -----------------------------------------------------------------------------------------------------
struct SlaCall {
  sage_tensor_desc q = tensor({1, 4, 256, 64}, 1 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc k = tensor({1, 2, 256, 64}, 2 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc v = tensor({1, 2, 256, 64}, 3 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc o_sparse = tensor({1, 4, 256, 64}, 4 * kMiB, SAGE_DTYPE_F16);
  sage_tensor_desc o_linear = tensor({1, 4, 256, 64}, 5 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc d_sparse = tensor({1, 4, 256, 64}, 6 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc d_linear = tensor({1, 4, 256, 64}, 7 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc dq = tensor({1, 4, 256, 64}, 8 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc dk = tensor({1, 2, 256, 64}, 9 * kMiB, SAGE_DTYPE_F32);
  sage_tensor_desc dv = tensor({1, 2, 256, 64}, 10 * kMiB, SAGE_DTYPE_F32);
  bool with_o_sparse = true;

  sage_sla_args forward() const {
    sage_sla_args args{};
    args.q = &q;
    args.k = &k;
    args.v = &v;
    args.o_sparse = &o_sparse;
    args.o_linear = &o_linear;
    return args;
  }
  sage_sla_args backward() const {
    sage_sla_args args{};
    args.q = &q;
    args.k = &k;
    args.v = &v;
    args.o_sparse = with_o_sparse ? &o_sparse : nullptr;
    args.d_sparse = &d_sparse;
    args.d_linear = &d_linear;
    args.dq = &dq;
    args.dk = &dk;
    args.dv = &dv;
    return args;
  }
};

SlaRequirements slaRequirements() { return {64, 0}; }

std::string slaForwardRejection(const std::function<void(SlaCall &)> &mutate, const std::string &argument) {
  SlaCall call;
  mutate(call);
  return rejection([&] { validateSlaForwardArgs(call.forward(), slaRequirements()); }, argument);
}

std::string slaBackwardRejection(const std::function<void(SlaCall &)> &mutate, const std::string &argument) {
  SlaCall call;
  mutate(call);
  return rejection([&] { validateSlaBackwardArgs(call.backward(), slaRequirements()); }, argument);
}

} // namespace

TEST_CASE("backward: a good call gives the shape and pointers") {
  const BackwardCall call;
  const ValidatedBackward validated = validateBackwardArgs(call.args(), backwardRequirements());
  CHECK(validated.tensors.batch == 2);
  CHECK(validated.tensors.heads_q == 4);
  CHECK(validated.tensors.heads_kv == 2);
  CHECK(validated.tensors.tokens_q == 100);
  CHECK(validated.tensors.tokens_kv == 80);
  CHECK(validated.tensors.d_v == address(9 * kMiB));
  CHECK(validated.regions.size() == 9);
}

TEST_CASE("backward: outputs overlap no input and no other output") {
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.d_q.data = c.q.data; }, "d_q"), "overlaps q"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.d_v.data = c.d_k.data; }, "d_v"), "overlaps d_k"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.d_k.data = c.lse.data; }, "d_k"), "overlaps lse"));
  // Partly: d_o's last bytes under d_q's first.
  CHECK(contains(
      backwardRejection([](BackwardCall &c) { c.d_q.data = address(5 * kMiB + 2 * 4 * 100 * 64 * 2 - 16); }, "d_q"),
      "overlaps d_o"));
  // Inputs may share memory: q = k = v is a self-attention a caller may well pass.
  BackwardCall same;
  same.q = tensor({2, 2, 80, 64}, 1 * kMiB, SAGE_DTYPE_F16);
  same.o = tensor({2, 2, 80, 64}, 4 * kMiB, SAGE_DTYPE_F16);
  same.d_o = tensor({2, 2, 80, 64}, 5 * kMiB, SAGE_DTYPE_F16);
  same.d_q = tensor({2, 2, 80, 64}, 7 * kMiB, SAGE_DTYPE_F16);
  same.lse = tensor({2, 2, 80}, 6 * kMiB, SAGE_DTYPE_F32);
  same.k.data = same.v.data = same.q.data;
  CHECK_NOTHROW(validateBackwardArgs(same.args(), backwardRequirements()));
}

TEST_CASE("backward: shapes, dtypes, alignment and contiguity name the argument") {
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.d_k.shape[2] = 81; }, "d_k"),
                 "expected shape [2, 2, 80, 64]"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.lse.dtype = SAGE_DTYPE_F16; }, "lse"),
                 "expected dtype f32, got f16"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.lse.data = address(6 * kMiB + 2); }, "lse"),
                 "4-byte aligned"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.v.data = address(3 * kMiB + 8); }, "v"), "16-byte aligned"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.o.strides[2] = 128; }, "o"),
                 "o: must be contiguous: expected stride 64 (elements) in dimension 2, got 128"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.k.shape[1] = 3; }, "k"), "must divide"));
  CHECK(contains(backwardRejection([](BackwardCall &c) { c.q.shape[3] = 128; }, "q"), "head_dim"));
  backwardRejection([](BackwardCall &c) { c.d_q.device = 1; }, "d_q");
  backwardRejection([](BackwardCall &c) { c.d_o.dtype = static_cast<sage_dtype>(9); }, "d_o");
  backwardRejection([](BackwardCall &c) { c.softmax_scale = std::nanf(""); }, "softmax_scale");
  backwardRejection([](BackwardCall &c) { c.softmax_scale = -1.0f; }, "softmax_scale");
  BackwardCall missing;
  sage_backward_args args = missing.args();
  args.d_v = nullptr;
  CHECK(contains(rejection([&] { validateBackwardArgs(args, backwardRequirements()); }, "d_v"), "must not be null"));
}

TEST_CASE("backward workspace size: q and k are validated as the run validates them") {
  const BackwardCall call;
  const BackwardShape shape = validateBackwardInputs(&call.q, &call.k, backwardRequirements());
  CHECK(shape.tokens_kv == 80);
  sage_tensor_desc q = call.q;
  q.strides[1] = 0;
  rejection([&] { validateBackwardInputs(&q, &call.k, backwardRequirements()); }, "q");
  q = call.q;
  q.dtype = SAGE_DTYPE_F32;
  rejection([&] { validateBackwardInputs(&q, &call.k, backwardRequirements()); }, "q");
  sage_tensor_desc k = call.k;
  k.shape[0] = 3;
  CHECK(contains(rejection([&] { validateBackwardInputs(&call.q, &k, backwardRequirements()); }, "k"),
                 "expected shape [2, 2, 80, 64]"));
  k = call.k;
  k.data = nullptr;
  rejection([&] { validateBackwardInputs(&call.q, &k, backwardRequirements()); }, "k");
  rejection([&] { validateBackwardInputs(&call.q, nullptr, backwardRequirements()); }, "k");
}

TEST_CASE("SLA forward: o_sparse and o_linear overlap nothing; alignment as the kernels need it") {
  const SlaCall call;
  const ValidatedSlaForward validated = validateSlaForwardArgs(call.forward(), slaRequirements());
  CHECK(validated.shape.heads_kv == 2);
  CHECK(validated.tensors.o_linear == address(5 * kMiB));
  CHECK(validated.tensors.k_strides.head == 256 * 64);
  CHECK(contains(slaForwardRejection([](SlaCall &c) { c.o_sparse.data = c.q.data; }, "o_sparse"), "overlaps q"));
  CHECK(contains(slaForwardRejection([](SlaCall &c) { c.o_linear.data = c.o_sparse.data; }, "o_linear"),
                 "overlaps o_sparse"));
  CHECK(contains(slaForwardRejection([](SlaCall &c) { c.o_linear.data = address(5 * kMiB + 1); }, "o_linear"),
                 "4-byte aligned"));
  // o_linear at any 4-byte boundary (the output kernel tests the address before pairing stores); q, k, v go to the
  // sparse attention's prologue, which reads 16 bytes at a time, and o_sparse is its output.
  SlaCall shifted;
  shifted.o_linear.data = address(5 * kMiB + 4);
  CHECK_NOTHROW(validateSlaForwardArgs(shifted.forward(), slaRequirements()));
  CHECK(contains(slaForwardRejection([](SlaCall &c) { c.q.data = address(1 * kMiB + 2); }, "q"),
                 "q: data must be 16-byte aligned"));
  slaForwardRejection([](SlaCall &c) { c.v.data = address(3 * kMiB + 8); }, "v");
  slaForwardRejection([](SlaCall &c) { c.o_sparse.data = address(4 * kMiB + 2); }, "o_sparse");
  slaForwardRejection([](SlaCall &c) { c.o_linear.dtype = SAGE_DTYPE_F16; }, "o_linear");
  slaForwardRejection([](SlaCall &c) { c.v.shape[2] = 255; }, "v");
  CHECK(contains(slaForwardRejection([](SlaCall &c) { c.k.shape[1] = 3; }, "k"), "must divide"));
  slaForwardRejection([](SlaCall &c) { c.q.shape[3] = 128; }, "q");
}

TEST_CASE("SLA backward: dq, dk, dv overlap no input and no other output") {
  const SlaCall call;
  CHECK_NOTHROW(validateSlaBackwardArgs(call.backward(), slaRequirements()));
  CHECK(contains(slaBackwardRejection([](SlaCall &c) { c.dq.data = c.d_sparse.data; }, "dq"), "overlaps d_sparse"));
  CHECK(contains(slaBackwardRejection([](SlaCall &c) { c.dv.data = c.dk.data; }, "dv"), "overlaps dk"));
  CHECK(contains(slaBackwardRejection([](SlaCall &c) { c.dk.data = c.o_sparse.data; }, "dk"), "overlaps o_sparse"));
  CHECK(contains(slaBackwardRejection([](SlaCall &c) { c.dq.data = c.q.data; }, "dq"), "overlaps q"));
  SlaCall without;
  without.with_o_sparse = false;
  without.dk.data = without.o_sparse.data; // not an argument now
  CHECK(validateSlaBackwardArgs(without.backward(), slaRequirements()).tensors.o_sparse == nullptr);
  slaBackwardRejection([](SlaCall &c) { c.d_linear.data = address(7 * kMiB + 2); }, "d_linear");
  // The backward's kernels read q, k, v, dO^s and dO^l at any element-aligned address.
  SlaCall shifted;
  shifted.q.data = address(1 * kMiB + 2);
  shifted.d_sparse.data = address(6 * kMiB + 4);
  CHECK_NOTHROW(validateSlaBackwardArgs(shifted.backward(), slaRequirements()));
  slaBackwardRejection([](SlaCall &c) { c.dk.data = address(9 * kMiB + 1); }, "dk");
}

TEST_CASE("SLA workspace size: q and k are validated as the calls validate them") {
  const SlaCall call;
  CHECK(validateSlaInputs(&call.q, &call.k, slaRequirements()).tokens_kv == 256);
  sage_tensor_desc q = call.q;
  q.data = address(1 * kMiB + 2); // element-aligned: the backward takes it
  CHECK_NOTHROW(validateSlaInputs(&q, &call.k, slaRequirements()));
  q.data = address(1 * kMiB + 1);
  CHECK(contains(rejection([&] { validateSlaInputs(&q, &call.k, slaRequirements()); }, "q"), "2-byte aligned"));
  q = call.q;
  q.strides[2] = 128;
  rejection([&] { validateSlaInputs(&q, &call.k, slaRequirements()); }, "q");
  sage_tensor_desc k = call.k;
  k.shape[2] = int64_t(1) << 31;
  CHECK(contains(rejection([&] { validateSlaInputs(&call.q, &k, slaRequirements()); }, "k"), "[1, 1073741824]"));
}

TEST_CASE("SLA in bf16: q, k, v and o_sparse in the SLA object's dtype; mixed dtypes are refused by name") {
  const SlaRequirements bf16{64, 0, DataType::bf16};
  SlaCall call;
  for (sage_tensor_desc *tensor : {&call.q, &call.k, &call.v, &call.o_sparse})
    tensor->dtype = SAGE_DTYPE_BF16;
  CHECK(validateSlaForwardArgs(call.forward(), bf16).shape.heads_q == 4);
  CHECK_NOTHROW(validateSlaBackwardArgs(call.backward(), bf16));
  CHECK(validateSlaInputs(&call.q, &call.k, bf16).tokens_q == 256);
  // One f16 tensor among bf16 ones, for either direction and the workspace size: named, with the object's dtype.
  for (sage_tensor_desc SlaCall::*member : {&SlaCall::q, &SlaCall::k, &SlaCall::v, &SlaCall::o_sparse}) {
    SlaCall mixed = call;
    (mixed.*member).dtype = SAGE_DTYPE_F16;
    const std::string argument = member == &SlaCall::q   ? "q"
                                 : member == &SlaCall::k ? "k"
                                 : member == &SlaCall::v ? "v"
                                                         : "o_sparse";
    CAPTURE(argument);
    const std::string expected = argument + ": expected dtype bf16 (the SLA object's config.dtype";
    CHECK(contains(rejection([&] { validateSlaForwardArgs(mixed.forward(), bf16); }, argument), expected));
    CHECK(contains(rejection([&] { validateSlaBackwardArgs(mixed.backward(), bf16); }, argument), expected));
  }
  sage_tensor_desc k = call.k;
  k.dtype = SAGE_DTYPE_F16;
  CHECK(contains(rejection([&] { validateSlaInputs(&call.q, &k, bf16); }, "k"), "expected dtype bf16"));
  // An f16 object refuses bf16 q; the f32 tensors stay f32 in a bf16 object.
  CHECK(contains(rejection([&] { validateSlaInputs(&call.q, &call.k, slaRequirements()); }, "q"),
                 "q: expected dtype f16 (the SLA object's config.dtype"));
  SlaCall o_linear = call;
  o_linear.o_linear.dtype = SAGE_DTYPE_BF16;
  rejection([&] { validateSlaForwardArgs(o_linear.forward(), bf16); }, "o_linear");
  SlaCall dq = call;
  dq.dq.dtype = SAGE_DTYPE_BF16;
  rejection([&] { validateSlaBackwardArgs(dq.backward(), bf16); }, "dq");
}

TEST_CASE("SLA dtype: SAGE_DTYPE_F16 or 0 (a zeroed config) is f16, SAGE_DTYPE_BF16 bf16, others are refused") {
  CHECK(slaDataTypeOf(0) == DataType::f16);
  CHECK(slaDataTypeOf(SAGE_DTYPE_F16) == DataType::f16);
  CHECK(slaDataTypeOf(SAGE_DTYPE_BF16) == DataType::bf16);
  for (int bad : {static_cast<int>(SAGE_DTYPE_F32), static_cast<int>(SAGE_DTYPE_U8), -1, 9})
    CHECK(contains(rejection([&] { slaDataTypeOf(bad); }, "config.dtype"), "expected SAGE_DTYPE_F16 (1)"));
}

TEST_CASE("SLA percentages: NaN, infinities and out-of-range values are refused by name") {
  sage::SlaSpec preset;
  preset.critical_percent = 5;
  preset.negligible_percent = 10;
  sage_sla_config config{};
  config.critical_percent = 0;    // the preset's
  config.negligible_percent = -1; // the preset's
  config.feature_map = -1;        // the preset's
  CHECK(slaSpecOf(config, preset) == preset);
  config.critical_percent = 20;
  config.negligible_percent = 30;
  config.feature_map = 2;
  const sage::SlaSpec chosen = slaSpecOf(config, preset);
  CHECK(chosen.critical_percent == 20);
  CHECK(chosen.negligible_percent == 30);
  CHECK(chosen.feature_map == sage::FeatureMap::relu);

  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, 100.5}) {
    sage_sla_config c = config;
    c.critical_percent = bad;
    CHECK(contains(rejection([&] { slaSpecOf(c, preset); }, "config.critical_percent"), "expected a"));
  }
  for (double bad : {nan, inf, -inf, 100.0}) {
    sage_sla_config c = config;
    c.negligible_percent = bad;
    rejection([&] { slaSpecOf(c, preset); }, "config.negligible_percent");
  }
  sage_sla_config sum = config;
  sum.critical_percent = 60;
  sum.negligible_percent = 50;
  CHECK(contains(rejection([&] { slaSpecOf(sum, preset); }, "config.critical_percent"), "at most 100"));
  sage_sla_config map = config;
  map.feature_map = 3;
  rejection([&] { slaSpecOf(map, preset); }, "config.feature_map");
  map.feature_map = -2;
  rejection([&] { slaSpecOf(map, preset); }, "config.feature_map");
}
