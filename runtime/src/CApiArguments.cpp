// The C ABI's argument checks (CApiArguments.h): the entry points' tensors through the shared rules.
#include "sage/runtime/CApiArguments.h"

#include "sage/runtime/ArgumentError.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace sage::runtime::capi {
namespace {

constexpr int64_t kSlaMaxSize = int64_t(1) << 30; // every SLA size: the kernels index with 32-bit counts

SageTensorStrides contiguousStrides(const schedules::ProblemShape &shape, bool q_side) {
  const int64_t heads = q_side ? shape.heads_q : shape.heads_kv, tokens = q_side ? shape.tokens_q : shape.tokens_kv;
  return {heads * tokens * shape.head_dim, tokens * shape.head_dim, shape.head_dim};
}

// How aligned a tensor's data must be beyond its element size, and why.
struct Alignment {
  int64_t bytes = 0; // 0: the element size only
  const char *why = "";
};

// The backward's kernels move 16 bytes at a time (sage_c.h documents it); contiguous rows of a head dim that is a
// multiple of 8 stay aligned.
constexpr Alignment kBackwardAlignment{16, "the backward's kernels move 16 bytes at a time"};
// SLA's forward hands q, k and v to the block-sparse attention, whose prologue and TMA read 16 bytes at a time, and
// o_sparse to it as its output (written 2 elements at a time). The SLA kernels themselves read and write every other
// tensor, and the backward's, at any element-aligned address (they test the address before vector accesses).
constexpr Alignment kSlaAttentionInput{16, "the sparse attention reads 8 elements at a time"};
constexpr Alignment kSlaAttentionOutput{4, "the sparse attention writes 2 elements at a time"};

// A tensor every entry point takes whole: `rank`-D contiguous row-major, `dtype`, on `device`, of `shape`, its data
// aligned to its element size and to `alignment`.
TensorDescription wholeTensor(const sage_tensor_desc *tensor, const char *argument, DataType dtype, int device,
                              std::initializer_list<int64_t> shape, std::string_view meaning, Alignment alignment) {
  const TensorDescription description = describe(tensor, argument);
  checkTensorBasics(description, argument, static_cast<int>(shape.size()), dtype, device);
  checkShape(description, argument, shape, meaning);
  checkContiguous(description, argument);
  checkAlignment(description, argument, alignment.bytes, alignment.why);
  extentBytes(description, argument);
  return description;
}

// A size the kernels count in `int`: [1, limit].
void checkSize(int64_t value, const char *argument, const char *what, int64_t limit) {
  if (value < 1 || value > limit)
    throw ArgumentError(argument, fmt::format("{} must lie in [1, {}], got {}", what, limit, value));
}

double percent(double value, const char *argument, bool critical, double preset) {
  // NaN and infinities first: a comparison with the "keep the preset's" sentinel would let them through.
  if (!std::isfinite(value))
    throw ArgumentError(argument,
                        fmt::format("expected a finite percentage ({}; {} keeps the preset's {}), got {}",
                                    critical ? "(0, 100]" : "[0, 100)", critical ? "<= 0" : "< 0", preset, value));
  if (critical ? value > 100.0 : value >= 100.0)
    throw ArgumentError(argument,
                        fmt::format("expected a percentage in {}, got {}", critical ? "(0, 100]" : "[0, 100)", value));
  if (critical ? value <= 0.0 : value < 0.0)
    return preset;
  return value;
}

// q, k, v and o_sparse share the SLA object's dtype (config.dtype): one kernel module per dtype, no mixed inputs.
void checkSlaDtype(const TensorDescription &tensor, const char *argument, const SlaRequirements &requirements) {
  if (tensor.dtype != requirements.dtype)
    throw ArgumentError(argument, fmt::format("expected dtype {} (the SLA object's config.dtype, as q, k, v and "
                                              "o_sparse must all be), got {}",
                                              nameOf(requirements.dtype), nameOf(tensor.dtype)));
}

} // namespace

DataType dataTypeOf(int dtype, const char *argument) {
  switch (dtype) {
  case SAGE_DTYPE_F16:
    return DataType::f16;
  case SAGE_DTYPE_BF16:
    return DataType::bf16;
  case SAGE_DTYPE_F32:
    return DataType::f32;
  case SAGE_DTYPE_U8:
    return DataType::u8;
  case SAGE_DTYPE_BOOL:
    return DataType::boolean;
  case SAGE_DTYPE_I32:
    return DataType::i32;
  }
  throw ArgumentError(argument, "expected a sage_dtype (1 to 6), got " + std::to_string(dtype));
}

TensorDescription describe(const sage_tensor_desc *tensor, const char *argument) {
  if (!tensor)
    throw ArgumentError(argument, "must not be null");
  if (tensor->ndim < 1 || tensor->ndim > kMaxTensorRank)
    throw ArgumentError(argument, "ndim must be 1 to 4, got " + std::to_string(tensor->ndim));
  TensorDescription description;
  description.data = tensor->data;
  description.rank = tensor->ndim;
  for (int i = 0; i < tensor->ndim; ++i) {
    description.shape[i] = tensor->shape[i];
    description.strides[i] = tensor->strides[i];
  }
  description.dtype = dataTypeOf(tensor->dtype, argument);
  description.device = tensor->device;
  return description;
}

BackwardShape validateBackwardInputs(const sage_tensor_desc *q, const sage_tensor_desc *k,
                                     const BackwardRequirements &requirements) {
  const TensorDescription q_desc = describe(q, "q"), k_desc = describe(k, "k");
  checkTensorBasics(q_desc, "q", 4, requirements.dtype, requirements.device);
  checkTensorBasics(k_desc, "k", 4, requirements.dtype, requirements.device);
  BackwardShape shape{q_desc.shape[0], q_desc.shape[1], k_desc.shape[1], q_desc.shape[2], k_desc.shape[2]};
  if (q_desc.shape[3] != requirements.head_dim)
    throw ArgumentError("q",
                        fmt::format("head_dim (last size) must be {}, got {}", requirements.head_dim, q_desc.shape[3]));
  if (shape.heads_q % shape.heads_kv != 0)
    throw ArgumentError(
        "k", fmt::format("{} heads must divide q's {} heads (grouped-query attention)", shape.heads_kv, shape.heads_q));
  const int64_t d = requirements.head_dim;
  wholeTensor(q, "q", requirements.dtype, requirements.device, {shape.batch, shape.heads_q, shape.tokens_q, d},
              "batch, heads_q, tokens_q, head_dim", kBackwardAlignment);
  wholeTensor(k, "k", requirements.dtype, requirements.device, {shape.batch, shape.heads_kv, shape.tokens_kv, d},
              "q's batch, heads_kv, tokens_kv, head_dim", kBackwardAlignment);
  return shape;
}

ValidatedBackward validateBackwardArgs(const sage_backward_args &args, const BackwardRequirements &requirements) {
  const BackwardShape shape = validateBackwardInputs(args.q, args.k, requirements);
  const int64_t d = requirements.head_dim;
  const std::initializer_list<int64_t> q_shape{shape.batch, shape.heads_q, shape.tokens_q, d};
  const std::initializer_list<int64_t> kv_shape{shape.batch, shape.heads_kv, shape.tokens_kv, d};
  const char *q_meaning = "q's shape: batch, heads_q, tokens_q, head_dim";
  const char *kv_meaning = "k's shape: batch, heads_kv, tokens_kv, head_dim";
  ValidatedBackward result;
  MemoryRegions &regions = result.regions;
  auto take = [&](const sage_tensor_desc *tensor, const char *argument, DataType dtype,
                  std::initializer_list<int64_t> expected, const char *meaning, bool written) {
    const TensorDescription description =
        wholeTensor(tensor, argument, dtype, requirements.device, expected, meaning, kBackwardAlignment);
    regions.add(regionOf(description, argument, written));
    return const_cast<void *>(description.data);
  };
  BackwardTensors &tensors = result.tensors;
  tensors.q = take(args.q, "q", requirements.dtype, q_shape, q_meaning, false);
  tensors.k = take(args.k, "k", requirements.dtype, kv_shape, kv_meaning, false);
  tensors.v = take(args.v, "v", requirements.dtype, kv_shape, kv_meaning, false);
  tensors.o = take(args.o, "o", requirements.dtype, q_shape, q_meaning, false);
  tensors.d_o = take(args.d_o, "d_o", requirements.dtype, q_shape, q_meaning, false);
  tensors.lse = static_cast<const float *>(take(
      args.lse, "lse", DataType::f32, {shape.batch, shape.heads_q, shape.tokens_q}, "batch, heads_q, tokens_q", false));
  tensors.d_q = take(args.d_q, "d_q", requirements.dtype, q_shape, q_meaning, true);
  tensors.d_k = take(args.d_k, "d_k", requirements.dtype, kv_shape, kv_meaning, true);
  tensors.d_v = take(args.d_v, "d_v", requirements.dtype, kv_shape, kv_meaning, true);
  regions.checkDisjoint();
  if (!(args.softmax_scale >= 0.0f) || !std::isfinite(args.softmax_scale))
    throw ArgumentError(
        "softmax_scale",
        fmt::format("expected 0 (1 / sqrt(head_dim)) or a positive finite number, got {}", args.softmax_scale));
  tensors.batch = shape.batch;
  tensors.heads_q = shape.heads_q;
  tensors.heads_kv = shape.heads_kv;
  tensors.tokens_q = shape.tokens_q;
  tensors.tokens_kv = shape.tokens_kv;
  tensors.softmax_scale = args.softmax_scale;
  return result;
}

DataType slaDataTypeOf(int dtype) {
  if (dtype == 0 || dtype == SAGE_DTYPE_F16)
    return DataType::f16;
  if (dtype == SAGE_DTYPE_BF16)
    return DataType::bf16;
  throw ArgumentError("config.dtype",
                      fmt::format("expected SAGE_DTYPE_F16 ({}), SAGE_DTYPE_BF16 ({}) or 0 (f16), got {}",
                                  static_cast<int>(SAGE_DTYPE_F16), static_cast<int>(SAGE_DTYPE_BF16), dtype));
}

SlaSpec slaSpecOf(const sage_sla_config &config, SlaSpec preset) {
  SlaSpec spec = preset;
  spec.critical_percent = percent(config.critical_percent, "config.critical_percent", true, preset.critical_percent);
  spec.negligible_percent =
      percent(config.negligible_percent, "config.negligible_percent", false, preset.negligible_percent);
  if (spec.critical_percent + spec.negligible_percent > 100.0)
    throw ArgumentError("config.critical_percent", fmt::format("k_h + k_l must be at most 100, got {} + {}",
                                                               spec.critical_percent, spec.negligible_percent));
  if (config.feature_map >= 0) {
    if (config.feature_map > 2)
      throw ArgumentError("config.feature_map",
                          fmt::format("expected 0 (softmax), 1 (elu + 1), 2 (relu) or -1, got {}", config.feature_map));
    spec.feature_map = static_cast<FeatureMap>(config.feature_map);
  } else if (config.feature_map != -1) {
    throw ArgumentError("config.feature_map",
                        fmt::format("expected 0 (softmax), 1 (elu + 1), 2 (relu) or -1, got {}", config.feature_map));
  }
  return spec;
}

schedules::ProblemShape validateSlaInputs(const sage_tensor_desc *q, const sage_tensor_desc *k,
                                          const SlaRequirements &requirements) {
  const TensorDescription q_desc = describe(q, "q"), k_desc = describe(k, "k");
  checkSlaDtype(q_desc, "q", requirements);
  checkSlaDtype(k_desc, "k", requirements);
  checkTensorBasics(q_desc, "q", 4, requirements.dtype, requirements.device);
  checkTensorBasics(k_desc, "k", 4, requirements.dtype, requirements.device);
  for (int i = 0; i < 4; ++i) {
    checkSize(q_desc.shape[i], "q", "every size", kSlaMaxSize);
    checkSize(k_desc.shape[i], "k", "every size", kSlaMaxSize);
  }
  if (q_desc.shape[3] != requirements.head_dim)
    throw ArgumentError("q", fmt::format("head_dim (last size) must be the SLA object's {}, got {}",
                                         requirements.head_dim, q_desc.shape[3]));
  const schedules::ProblemShape shape{q_desc.shape[0], q_desc.shape[1], k_desc.shape[1],
                                      q_desc.shape[2], k_desc.shape[2], requirements.head_dim};
  if (shape.heads_q % shape.heads_kv != 0)
    throw ArgumentError(
        "k", fmt::format("{} heads must divide q's {} heads (grouped-query attention)", shape.heads_kv, shape.heads_q));
  // The workspace's size depends on q and k alone, for either direction: their element alignment here; the forward
  // asks for more below.
  wholeTensor(q, "q", requirements.dtype, requirements.device,
              {shape.batch, shape.heads_q, shape.tokens_q, shape.head_dim}, "batch, heads_q, tokens_q, head_dim", {});
  wholeTensor(k, "k", requirements.dtype, requirements.device,
              {shape.batch, shape.heads_kv, shape.tokens_kv, shape.head_dim},
              "q's batch, heads_kv, tokens_kv, head_dim", {});
  return shape;
}

namespace {

// An SLA tensor of q's shape (q_side) or k's, in `dtype`, added to `regions`. A tensor in the SLA object's dtype is
// refused by checkSlaDtype's message when it has another.
void *slaTensor(const sage_tensor_desc *tensor, const char *argument, DataType dtype, bool q_side, bool written,
                Alignment alignment, const SlaRequirements &requirements, const schedules::ProblemShape &shape,
                MemoryRegions &regions) {
  if (dtype == requirements.dtype)
    checkSlaDtype(describe(tensor, argument), argument, requirements);
  const TensorDescription description = wholeTensor(
      tensor, argument, dtype, requirements.device,
      {shape.batch, q_side ? shape.heads_q : shape.heads_kv, q_side ? shape.tokens_q : shape.tokens_kv, shape.head_dim},
      q_side ? "q's shape" : "k's shape", alignment);
  regions.add(regionOf(description, argument, written));
  return const_cast<void *>(description.data);
}

// The tensors both SLA directions read: q, k, v (the SLA object's dtype).
template <typename Tensors>
void slaInputs(const sage_sla_args &args, Alignment alignment, const SlaRequirements &requirements,
               const schedules::ProblemShape &shape, Tensors &tensors, MemoryRegions &regions) {
  tensors.q = slaTensor(args.q, "q", requirements.dtype, true, false, alignment, requirements, shape, regions);
  tensors.k = slaTensor(args.k, "k", requirements.dtype, false, false, alignment, requirements, shape, regions);
  tensors.v = slaTensor(args.v, "v", requirements.dtype, false, false, alignment, requirements, shape, regions);
  tensors.q_strides = contiguousStrides(shape, true);
  tensors.k_strides = tensors.v_strides = contiguousStrides(shape, false);
}

} // namespace

ValidatedSlaForward validateSlaForwardArgs(const sage_sla_args &args, const SlaRequirements &requirements) {
  ValidatedSlaForward result;
  result.shape = validateSlaInputs(args.q, args.k, requirements);
  slaInputs(args, kSlaAttentionInput, requirements, result.shape, result.tensors, result.regions);
  result.tensors.o = slaTensor(args.o_sparse, "o_sparse", requirements.dtype, true, true, kSlaAttentionOutput,
                               requirements, result.shape, result.regions);
  result.tensors.o_strides = contiguousStrides(result.shape, true);
  result.tensors.o_linear = static_cast<float *>(
      slaTensor(args.o_linear, "o_linear", DataType::f32, true, true, {}, requirements, result.shape, result.regions));
  result.regions.checkDisjoint();
  return result;
}

ValidatedSlaBackward validateSlaBackwardArgs(const sage_sla_args &args, const SlaRequirements &requirements) {
  ValidatedSlaBackward result;
  result.shape = validateSlaInputs(args.q, args.k, requirements);
  const schedules::ProblemShape &shape = result.shape;
  MemoryRegions &regions = result.regions;
  SlaBackwardTensors &tensors = result.tensors;
  slaInputs(args, {}, requirements, shape, tensors, regions);
  tensors.d_sparse = static_cast<const float *>(
      slaTensor(args.d_sparse, "d_sparse", DataType::f32, true, false, {}, requirements, shape, regions));
  tensors.d_linear = static_cast<const float *>(
      slaTensor(args.d_linear, "d_linear", DataType::f32, true, false, {}, requirements, shape, regions));
  if (args.o_sparse) { // optional: the forward's O^s, so that a saved L spares the statistics kernel
    tensors.o_sparse =
        slaTensor(args.o_sparse, "o_sparse", requirements.dtype, true, false, {}, requirements, shape, regions);
    tensors.o_sparse_strides = contiguousStrides(shape, true);
  }
  tensors.dq =
      static_cast<float *>(slaTensor(args.dq, "dq", DataType::f32, true, true, {}, requirements, shape, regions));
  tensors.dk =
      static_cast<float *>(slaTensor(args.dk, "dk", DataType::f32, false, true, {}, requirements, shape, regions));
  tensors.dv =
      static_cast<float *>(slaTensor(args.dv, "dv", DataType::f32, false, true, {}, requirements, shape, regions));
  regions.checkDisjoint();
  return result;
}

} // namespace sage::runtime::capi
