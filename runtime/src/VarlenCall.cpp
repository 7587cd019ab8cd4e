// Validation of a packed call: the packed tensors are checked as a dense NHD call of batch 1 over all tokens (the
// same rules: dtype, head dim, alignment, strides, extents, overlap), then the offsets' descriptors and the maxima.
#include "sage/runtime/VarlenCall.h"

#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/TensorValidation.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace sage::runtime {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kGridZMax = 65535; // gridDim.z: the sequences

DataType storageOf(schedules::InputType input) {
  return input == schedules::InputType::bf16 ? DataType::bf16 : DataType::f16;
}

// [total, heads, d] as the NHD tensor [1, total, heads, d]: a dimension of size 1 gets stride 0 (never stepped).
TensorDescription asBatchOfOne(const TensorDescription &packed, const char *name, DataType dtype, int device) {
  checkTensorBasics(packed, name, 3, dtype, device);
  TensorDescription view = packed;
  view.rank = 4;
  view.shape = {1, packed.shape[0], packed.shape[1], packed.shape[2]};
  view.strides = {0, packed.strides[0], packed.strides[1], packed.strides[2]};
  return view;
}

void checkOffsets(const TensorDescription &offsets, const char *name, int device) {
  checkTensorBasics(offsets, name, 1, DataType::i32, device);
  if (offsets.shape[0] < 2)
    throw ArgumentError(
        name, fmt::format("expected [batch + 1] cumulative lengths (at least 2 entries), got {}", shapeText(offsets)));
  checkContiguous(offsets, name);
  extentBytes(offsets, name);
}

void checkMaximum(int64_t value, const char *name, int64_t limit) {
  if (value < 1 || value > limit)
    throw ArgumentError(
        name, fmt::format("expected an upper bound of the sequences' lengths in [1, {}], got {}", limit, value));
}

} // namespace

schedules::ProblemShape varlenProblemShape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t max_seqlen_q,
                                           int64_t max_seqlen_kv, const KernelRequirements &requirements) {
  if (batch < 1 || batch > kGridZMax)
    throw ArgumentError("cu_seqlens_q", fmt::format("expected 1 to {} sequences, got {}", kGridZMax, batch));
  if (heads_q < 1 || heads_kv < 1 || heads_q % heads_kv != 0)
    throw ArgumentError("k",
                        fmt::format("{} heads must divide q's {} heads (grouped-query attention)", heads_kv, heads_q));
  // The kernels' 32-bit token counts, padded to a block (as a dense call's tokens).
  const int64_t limit = kInt32Max - std::max<int64_t>({requirements.block_q, requirements.block_kv, 256});
  checkMaximum(max_seqlen_q, "max_seqlen_q", limit);
  checkMaximum(max_seqlen_kv, "max_seqlen_kv", limit);
  return {batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_kv, requirements.head_dim};
}

ValidatedCall validateVarlenCall(const VarlenCall &call, const KernelRequirements &requirements) {
  if (requirements.block_sparse)
    throw ArgumentError("attention", "packed calls take no block mask: create the attention without block_sparse");
  const DataType storage = storageOf(requirements.input);
  AttentionCall dense;
  dense.layout = TensorLayout::nhd;
  dense.q = asBatchOfOne(call.q, "q", storage, requirements.device);
  dense.k = asBatchOfOne(call.k, "k", storage, requirements.device);
  dense.v = asBatchOfOne(call.v, "v", storage, requirements.device);
  dense.o = asBatchOfOne(call.o, "o", storage, requirements.device);
  if (call.lse) { // [heads_q, total_q] as [1, heads_q, total_q]
    const TensorDescription &lse = *call.lse;
    checkTensorBasics(lse, "lse", 2, DataType::f32, requirements.device);
    if (lse.shape[0] != call.q.shape[1] || lse.shape[1] != call.q.shape[0])
      throw ArgumentError("lse", fmt::format("expected shape [{}, {}] (q heads, total q tokens), got {}",
                                             call.q.shape[1], call.q.shape[0], shapeText(lse)));
    TensorDescription view = lse;
    view.rank = 3;
    view.shape = {1, lse.shape[0], lse.shape[1], 0};
    view.strides = {0, lse.strides[0], lse.strides[1], 0};
    dense.lse = view;
  } else if (requirements.writes_lse) {
    throw ArgumentError("lse", fmt::format("this attention writes the LSE: pass an f32 tensor [{}, {}] (q heads, "
                                           "total q tokens)",
                                           call.q.shape[1], call.q.shape[0]));
  }
  dense.causal_alignment = call.causal_alignment;
  checkOffsets(call.cu_seqlens_q, "cu_seqlens_q", requirements.device);
  checkOffsets(call.cu_seqlens_kv, "cu_seqlens_kv", requirements.device);
  if (call.cu_seqlens_kv.shape[0] != call.cu_seqlens_q.shape[0])
    throw ArgumentError("cu_seqlens_kv", fmt::format("expected {} entries (batch + 1, as cu_seqlens_q), got {}",
                                                     call.cu_seqlens_q.shape[0], call.cu_seqlens_kv.shape[0]));

  ValidatedCall result = validateAttentionCall(dense, requirements); // one batch of total_q and total_kv tokens
  const int64_t total_q = result.shape.tokens_q, total_kv = result.shape.tokens_kv;
  result.shape = varlenProblemShape(call.cu_seqlens_q.shape[0] - 1, result.shape.heads_q, result.shape.heads_kv,
                                    call.max_seqlen_q, call.max_seqlen_kv, requirements);
  result.regions.add(regionOf(call.cu_seqlens_q, "cu_seqlens_q", false));
  result.regions.add(regionOf(call.cu_seqlens_kv, "cu_seqlens_kv", false));
  result.regions.checkDisjoint();
  result.tensors.sequences = {static_cast<const int *>(call.cu_seqlens_q.data),
                              static_cast<const int *>(call.cu_seqlens_kv.data), static_cast<int>(total_q),
                              static_cast<int>(total_kv)};
  return result;
}

} // namespace sage::runtime
