// The LSE merge's argument checks (issue 30; runtime/MergeRunner.h and the C ABI's sage_merge_attention): what is
// refused before any GPU is touched, with the argument named, and how an accepted call is laid out for the kernel
// (row order and strides per layout, the vector path, in-place aliasing). No GPU needed: the pointers are never read.
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/MergeRunner.h"
#include "sage/sage_merge_c.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>

using namespace sage;
using namespace sage::runtime;

namespace {

const void *address(uintptr_t value) { return reinterpret_cast<const void *>(value); }

// A contiguous tensor of `shape` at `data`.
TensorDescription tensor(uintptr_t data, std::initializer_list<int64_t> shape, DataType dtype) {
  TensorDescription description;
  description.data = address(data);
  description.rank = static_cast<int>(shape.size());
  description.dtype = dtype;
  description.device = 0;
  int i = 0;
  for (int64_t size : shape)
    description.shape[i++] = size;
  int64_t stride = 1;
  for (int d = description.rank - 1; d >= 0; --d) {
    description.strides[d] = stride;
    stride *= description.shape[d];
  }
  return description;
}

// b 2, h 3, n 5, d 16 in `layout`: an f32 accumulator as a and out (in place), a bf16 part b, f32 LSEs.
MergeCall validCall(TensorLayout layout) {
  MergeCall call;
  call.layout = layout;
  const bool hnd = layout == TensorLayout::hnd;
  call.o_a = hnd ? tensor(0x100000, {2, 3, 5, 16}, DataType::f32) : tensor(0x100000, {2, 5, 3, 16}, DataType::f32);
  call.o_out = call.o_a;
  call.o_b = hnd ? tensor(0x200000, {2, 3, 5, 16}, DataType::bf16) : tensor(0x200000, {2, 5, 3, 16}, DataType::bf16);
  call.lse_a = tensor(0x300000, {2, 3, 5}, DataType::f32);
  call.lse_out = call.lse_a;
  call.lse_b = tensor(0x400000, {2, 3, 5}, DataType::f32);
  return call;
}

std::string refusal(const MergeCall &call) {
  try {
    validateMergeCall(call);
  } catch (const ArgumentError &error) {
    return error.what();
  }
  return "accepted";
}

} // namespace

TEST_CASE("an accepted merge: row order, strides, lanes and the vector path") {
  SUBCASE("HND") {
    const ValidatedMerge merge = validateMergeCall(validCall(TensorLayout::hnd));
    CHECK(merge.types ==
          codegen::MergeTypes{codegen::MergeElement::f32, codegen::MergeElement::bf16, codegen::MergeElement::f32});
    const SageMergeParams &p = merge.params;
    CHECK(p.rows == 30);
    CHECK(p.middle == 3);
    CHECK(p.inner == 5);
    CHECK(p.head_dim == 16);
    CHECK(p.lanes_per_row == 2);
    CHECK(p.vectorized == 1);
    CHECK(p.o_out == p.o_a);
    CHECK(p.lse_out == p.lse_a);
    CHECK(p.o_a_strides.outer == 240);
    CHECK(p.o_a_strides.middle == 80);
    CHECK(p.o_a_strides.inner == 16);
    CHECK(p.lse_b_strides.middle == 5); // [b, h, n]: heads
    CHECK(p.lse_b_strides.inner == 1);
  }
  SUBCASE("NHD: the rows run (b, n, h), the LSE's strides follow") {
    const ValidatedMerge merge = validateMergeCall(validCall(TensorLayout::nhd));
    const SageMergeParams &p = merge.params;
    CHECK(p.middle == 5);
    CHECK(p.inner == 3);
    CHECK(p.o_b_strides.middle == 48);
    CHECK(p.o_b_strides.inner == 16);
    CHECK(p.lse_a_strides.outer == 15);
    CHECK(p.lse_a_strides.middle == 1); // tokens: the LSE's last dimension
    CHECK(p.lse_a_strides.inner == 5);  // heads
  }
  SUBCASE("a row slice with a stride that breaks 16-byte accesses takes the element path") {
    MergeCall call = validCall(TensorLayout::hnd);
    call.o_b.data = address(0x200002); // bf16-aligned, not 16-byte aligned
    CHECK(validateMergeCall(call).params.vectorized == 0);
    call = validCall(TensorLayout::hnd);
    call.o_b.strides = {240, 80, 24, 1}; // a token stride of 48 bytes (rows of a wider tensor): still 16-byte
    CHECK(validateMergeCall(call).params.vectorized == 1);
    call.o_b.strides = {240, 80, 20, 1}; // 40 bytes
    CHECK(validateMergeCall(call).params.vectorized == 0);
  }
  SUBCASE("out apart from a: a new output in another dtype") {
    MergeCall call = validCall(TensorLayout::hnd);
    call.o_out = tensor(0x500000, {2, 3, 5, 16}, DataType::bf16);
    call.lse_out = tensor(0x600000, {2, 3, 5}, DataType::f32);
    const ValidatedMerge merge = validateMergeCall(call);
    CHECK(merge.types.out == codegen::MergeElement::bf16);
    CHECK(merge.params.o_out != merge.params.o_a);
  }
}

TEST_CASE("merge refusals name the argument") {
  MergeCall call = validCall(TensorLayout::hnd);
  call.lse_b.dtype = DataType::f16;
  CHECK(refusal(call).starts_with("lse_b: expected dtype f32"));

  call = validCall(TensorLayout::hnd);
  call.o_b.dtype = DataType::u8;
  CHECK(refusal(call).starts_with("o_b: expected dtype f16, bf16 or f32, got u8"));

  call = validCall(TensorLayout::hnd);
  call.o_b = tensor(0x200000, {2, 3, 6, 16}, DataType::bf16);
  CHECK(refusal(call).starts_with("o_b: expected o_out's shape [2, 3, 5, 16], got [2, 3, 6, 16]"));

  call = validCall(TensorLayout::nhd);
  call.lse_b = tensor(0x400000, {2, 5, 3}, DataType::f32); // [b, n, h]: the LSE is [b, h, n] in both layouts
  CHECK(refusal(call).starts_with("lse_b: expected shape [2, 3, 5]"));

  call = validCall(TensorLayout::hnd);
  call.o_b.strides = {480, 160, 32, 2};
  CHECK(refusal(call).starts_with("o_b: the head_dim stride (last) must be 1, got 2"));

  call = validCall(TensorLayout::hnd);
  for (TensorDescription *o : {&call.o_a, &call.o_b, &call.o_out})
    *o = tensor(reinterpret_cast<uintptr_t>(o->data), {2, 3, 5, 12}, o->dtype);
  CHECK(refusal(call).starts_with("o_out: head_dim (last size) must be a multiple of 8 up to 1024, got 12"));

  call = validCall(TensorLayout::hnd);
  call.o_b.device = 1;
  CHECK(refusal(call).starts_with("o_b: is in CUDA device 1, expected CUDA device 0"));

  call = validCall(TensorLayout::hnd);
  call.o_a.device = call.o_out.device = kHostMemory;
  CHECK(refusal(call).starts_with("o_out: is in host memory"));

  call = validCall(TensorLayout::hnd);
  call.o_a.data = call.o_out.data = address(0x100002); // f32 at a 2-byte address
  CHECK(refusal(call).starts_with("o_out: data must be 4-byte aligned"));

  call = validCall(TensorLayout::hnd);
  call.o_out.strides = {240, 80, 0, 1}; // every token of a head on one row: a written self-overlap
  call.o_a = call.o_out;
  CHECK(refusal(call).starts_with("o_out: is written, so its elements must not overlap"));
}

TEST_CASE("merge overlaps: out may be a exactly, nothing else") {
  MergeCall call = validCall(TensorLayout::hnd);
  CHECK(refusal(call) == "accepted"); // o_out == o_a and lse_out == lse_a

  call.o_out = tensor(0x100000 + 64, {2, 3, 5, 16}, DataType::f32); // a shifted by 16 elements: a partial overlap
  CHECK(refusal(call).starts_with("o_out: overlaps o_a in memory"));

  call = validCall(TensorLayout::hnd);
  call.o_a = tensor(0x100000, {2, 3, 5, 16}, DataType::f32);
  call.o_a.strides = {480, 160, 32, 1}; // the same address, other strides: not the same tensor
  CHECK(refusal(call).find("overlaps") != std::string::npos);

  call = validCall(TensorLayout::hnd);
  call.o_out = tensor(0x200000, {2, 3, 5, 16}, DataType::bf16); // o_b's memory, written
  CHECK(refusal(call).starts_with("o_out: overlaps o_b in memory"));

  call = validCall(TensorLayout::hnd);
  call.lse_out = call.lse_b; // written over part B's LSE
  CHECK(refusal(call).starts_with("lse_out: overlaps lse_b in memory"));

  call = validCall(TensorLayout::hnd);
  call.o_b = call.o_a; // both parts the accumulator: inputs may alias, but a is written
  call.o_b.dtype = DataType::f32;
  CHECK(refusal(call).find("overlaps") != std::string::npos);
}

TEST_CASE("sage_merge_attention refuses before touching a GPU") {
  CHECK(sage_merge_attention(nullptr) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()) == "args: must not be null");

  sage_tensor_desc o{reinterpret_cast<void *>(0x100000), 4, {1, 2, 4, 8}, {64, 32, 8, 1}, SAGE_DTYPE_F32, 0};
  sage_tensor_desc lse{reinterpret_cast<void *>(0x300000), 3, {1, 2, 4}, {8, 4, 1}, SAGE_DTYPE_F32, 0};
  sage_merge_args args{SAGE_LAYOUT_HND, &o, &lse, &o, &lse, &o, &lse, nullptr};
  args.o_b = nullptr;
  CHECK(sage_merge_attention(&args) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()) == "o_b: must not be null");

  args.o_b = &o;
  args.layout = static_cast<sage_layout>(7);
  CHECK(sage_merge_attention(&args) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).starts_with("layout: expected SAGE_LAYOUT_HND or SAGE_LAYOUT_NHD"));

  args.layout = SAGE_LAYOUT_HND;
  sage_tensor_desc host = o;
  host.device = SAGE_HOST_MEMORY;
  args.o_out = args.o_a = &host;
  CHECK(sage_merge_attention(&args) == SAGE_INVALID_ARGUMENT);
  CHECK(std::string(sage_last_error()).starts_with("o_out: is in host memory"));
}
