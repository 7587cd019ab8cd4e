// Validation of one attention call. Runs on every call: the checks are comparisons, and a message is built only
// when one fails.
#include "sage/runtime/AttentionCall.h"

#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/TensorValidation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>

namespace sage::runtime {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGridYZMax = 65535; // gridDim.y and gridDim.z: heads_q and batch

DataType storageOf(schedules::InputType input) {
  return input == schedules::InputType::bf16 ? DataType::bf16 : DataType::f16;
}

struct Dims {
  int64_t batch, heads, tokens, head_dim;
};

Dims dimsOf(const TensorDescription &tensor, TensorLayout layout) {
  const auto &s = tensor.shape;
  if (layout == TensorLayout::hnd)
    return {s[0], s[1], s[2], s[3]};
  return {s[0], s[2], s[1], s[3]};
}

// The kernels' (batch, head, token) strides. A dimension of size 1 is only ever indexed at 0: its stride, which
// frameworks leave arbitrary, becomes 0 so that no alignment rule trips over it.
SageTensorStrides stridesOf(const TensorDescription &tensor, TensorLayout layout) {
  std::array<int64_t, 3> s{};
  for (int i = 0; i < 3; ++i)
    s[i] = tensor.shape[i] == 1 ? 0 : tensor.strides[i];
  if (layout == TensorLayout::hnd)
    return {s[0], s[1], s[2]};
  return {s[0], s[2], s[1]};
}

// Q, K, V: 4-D, the kernel's dtype and device, 16-byte aligned data and strides of 8 elements (the prologue reads
// 8 elements at a time, the attention kernel copies V rows with 16-byte cp.async), the head dim contiguous.
Dims checkInput(const TensorDescription &tensor, const char *name, TensorLayout layout,
                const KernelRequirements &requirements) {
  checkTensorBasics(tensor, name, 4, storageOf(requirements.input), requirements.device);
  const Dims dims = dimsOf(tensor, layout);
  if (dims.head_dim != requirements.head_dim)
    throw ArgumentError(name, fmt::format("head dim (last size) is {}, but the kernel was built for head_dim {}",
                                          dims.head_dim, requirements.head_dim));
  if (tensor.strides[3] != 1)
    throw ArgumentError(name,
                        fmt::format("the head dim must be contiguous (stride 1), got stride {}", tensor.strides[3]));
  checkAlignment(tensor, name, 16, "the kernels read 8 elements at a time");
  for (int i = 0; i < 3; ++i)
    if (tensor.shape[i] != 1 && tensor.strides[i] % 8 != 0)
      throw ArgumentError(name, fmt::format("strides must be multiples of 8 elements (16 bytes), got {} in "
                                            "dimension {}",
                                            tensor.strides[i], i));
  extentBytes(tensor, name);
  return dims;
}

std::string layoutShape(TensorLayout layout, const char *heads, const char *tokens) {
  return layout == TensorLayout::hnd ? fmt::format("[batch, {}, {}, head_dim]", heads, tokens)
                                     : fmt::format("[batch, {}, {}, head_dim]", tokens, heads);
}

schedules::ProblemShape checkProblem(const TensorDescription &q, const TensorDescription &k, TensorLayout layout,
                                     const KernelRequirements &requirements) {
  if (layout != TensorLayout::hnd && layout != TensorLayout::nhd)
    throw ArgumentError("layout", "expected HND or NHD");
  const Dims q_dims = checkInput(q, "q", layout, requirements);
  const Dims k_dims = checkInput(k, "k", layout, requirements);
  if (k_dims.batch != q_dims.batch)
    throw ArgumentError("k", fmt::format("batch is {}, q's is {} (layout {}: {})", k_dims.batch, q_dims.batch,
                                         nameOf(layout), layoutShape(layout, "heads", "tokens")));
  if (q_dims.heads % k_dims.heads != 0)
    throw ArgumentError("k", fmt::format("{} heads must divide q's {} heads (grouped-query attention; layout {}: {})",
                                         k_dims.heads, q_dims.heads, nameOf(layout),
                                         layoutShape(layout, "heads", "tokens")));
  schedules::ProblemShape shape{q_dims.batch,  q_dims.heads,  k_dims.heads,
                                q_dims.tokens, k_dims.tokens, requirements.head_dim};
  // Launch grid (ceil(tokens_q / block_q), heads_q, batch) and the kernels' 32-bit token counts (padded).
  if (shape.batch > kGridYZMax)
    throw ArgumentError("q", fmt::format("batch {} exceeds the launch grid's limit of {}", shape.batch, kGridYZMax));
  if (shape.heads_q > kGridYZMax)
    throw ArgumentError("q", fmt::format("{} heads exceed the launch grid's limit of {}", shape.heads_q, kGridYZMax));
  const int64_t block = std::max<int64_t>({requirements.block_q, requirements.block_kv, 256});
  if (shape.tokens_q > kInt32Max - block)
    throw ArgumentError("q", fmt::format("{} tokens exceed the kernels' 32-bit limit", shape.tokens_q));
  if (shape.tokens_kv > kInt32Max - block)
    throw ArgumentError("k", fmt::format("{} tokens exceed the kernels' 32-bit limit", shape.tokens_kv));
  return shape;
}

} // namespace

std::string_view nameOf(TensorLayout layout) { return layout == TensorLayout::hnd ? "HND" : "NHD"; }

std::string_view nameOf(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top-left" : "bottom-right";
}

int64_t causalOffset(CausalAlignment alignment, int64_t tokens_q, int64_t tokens_kv) {
  return alignment == CausalAlignment::top_left ? 0 : tokens_kv - tokens_q;
}

schedules::ProblemShape problemShapeOf(const TensorDescription &q, const TensorDescription &k, TensorLayout layout,
                                       const KernelRequirements &requirements) {
  return checkProblem(q, k, layout, requirements);
}

ValidatedCall validateAttentionCall(const AttentionCall &call, const KernelRequirements &requirements) {
  const TensorLayout layout = call.layout;
  ValidatedCall result;
  result.shape = checkProblem(call.q, call.k, layout, requirements);
  const schedules::ProblemShape &shape = result.shape;

  checkInput(call.v, "v", layout, requirements);
  for (int i = 0; i < 4; ++i)
    if (call.v.shape[i] != call.k.shape[i])
      throw ArgumentError("v", fmt::format("shape {} must equal k's {}", shapeText(call.v), shapeText(call.k)));

  // O: q's shape and dtype; written two elements (4 bytes) at a time.
  const TensorDescription &o = call.o;
  checkTensorBasics(o, "o", 4, storageOf(requirements.input), requirements.device);
  for (int i = 0; i < 4; ++i)
    if (o.shape[i] != call.q.shape[i])
      throw ArgumentError("o", fmt::format("shape {} must equal q's {}", shapeText(o), shapeText(call.q)));
  if (o.strides[3] != 1)
    throw ArgumentError("o", fmt::format("the head dim must be contiguous (stride 1), got stride {}", o.strides[3]));
  checkAlignment(o, "o", 4, "the kernels write 2 elements at a time");
  for (int i = 0; i < 3; ++i)
    if (o.shape[i] != 1 && o.strides[i] % 2 != 0)
      throw ArgumentError("o", fmt::format("strides must be even, got {} in dimension {}", o.strides[i], i));
  checkNonOverlapping(o, "o");
  // Every tensor's span, for the overlap rule checked once all are known: o, lse and the workspace are written.
  MemoryRegions &regions = result.regions;
  regions.add(regionOf(call.q, "q", false));
  regions.add(regionOf(call.k, "k", false));
  regions.add(regionOf(call.v, "v", false));
  regions.add(regionOf(o, "o", true));

  float *lse = nullptr;
  if (requirements.writes_lse != call.lse.has_value())
    throw ArgumentError("lse", requirements.writes_lse
                                   ? fmt::format("this attention writes the LSE: pass an f32 tensor [{}, {}, {}]",
                                                 shape.batch, shape.heads_q, shape.tokens_q)
                                   : std::string("this attention was built without the LSE (create it with lse)"));
  if (call.lse) {
    const TensorDescription &tensor = *call.lse;
    checkTensorBasics(tensor, "lse", 3, DataType::f32, requirements.device);
    if (tensor.shape[0] != shape.batch || tensor.shape[1] != shape.heads_q || tensor.shape[2] != shape.tokens_q)
      throw ArgumentError("lse", fmt::format("expected shape [{}, {}, {}] (batch, q heads, q tokens), got {}",
                                             shape.batch, shape.heads_q, shape.tokens_q, shapeText(tensor)));
    checkContiguous(tensor, "lse");
    regions.add(regionOf(tensor, "lse", true));
    lse = static_cast<float *>(const_cast<void *>(tensor.data));
  }

  const unsigned char *block_mask = nullptr;
  if (call.block_mask) {
    const TensorDescription &tensor = *call.block_mask;
    if (!requirements.block_sparse)
      throw ArgumentError("block_mask", "this attention has no block-sparse mask (create it with a block_sparse "
                                        "variant)");
    const DataType dtype = tensor.dtype == DataType::boolean ? DataType::boolean : DataType::u8;
    checkTensorBasics(tensor, "block_mask", 4, dtype, requirements.device);
    const int64_t q_blocks = (shape.tokens_q + requirements.block_q - 1) / requirements.block_q;
    const int64_t kv_blocks = (shape.tokens_kv + requirements.block_kv - 1) / requirements.block_kv;
    if (tensor.shape[0] != shape.batch || tensor.shape[1] != shape.heads_q || tensor.shape[2] != q_blocks ||
        tensor.shape[3] != kv_blocks)
      throw ArgumentError("block_mask", fmt::format("expected shape [{}, {}, {}, {}] (batch, q heads, ceil(tokens_q / "
                                                    "{}), ceil(tokens_kv / {})), got {}",
                                                    shape.batch, shape.heads_q, q_blocks, kv_blocks,
                                                    requirements.block_q, requirements.block_kv, shapeText(tensor)));
    checkContiguous(tensor, "block_mask");
    regions.add(regionOf(tensor, "block_mask", false));
    block_mask = static_cast<const unsigned char *>(tensor.data);
  }

  regions.checkDisjoint();

  AttentionTensors &tensors = result.tensors;
  tensors.q = call.q.data;
  tensors.k = call.k.data;
  tensors.v = call.v.data;
  tensors.o = const_cast<void *>(o.data);
  tensors.q_strides = stridesOf(call.q, layout);
  tensors.k_strides = stridesOf(call.k, layout);
  tensors.v_strides = stridesOf(call.v, layout);
  tensors.o_strides = stridesOf(o, layout);
  tensors.lse = lse;
  tensors.block_mask = block_mask;
  if (call.causal_alignment != CausalAlignment::bottom_right && call.causal_alignment != CausalAlignment::top_left)
    throw ArgumentError("causal_alignment", "expected bottom-right or top-left");
  tensors.causal_alignment = call.causal_alignment;
  return result;
}

} // namespace sage::runtime
