// A variable-length (packed) attention call as a caller describes it, FlashAttention's varlen convention: Q packed as
// [total_q, heads_q, head_dim], K and V as [total_kv, heads_kv, head_dim], cu_seqlens_q / cu_seqlens_kv int32
// [batch + 1] on the device (sequence b is rows cu[b] .. cu[b + 1] - 1), max_seqlen_q / max_seqlen_kv upper bounds of
// the lengths (host values), O like Q, the natural-log LSE f32 [heads_q, total_q]. It runs as the dense problem
// (batch = sequences, tokens = the maxima) with per-sequence offsets (KernelAbi.h's SageSequenceOffsets).
//
// Only descriptors are checked: the offsets' values stay on the device (no host read in the call path, so a call can
// be captured in a CUDA graph); the kernels clamp what they read, so wrong offsets give wrong numbers, never an
// out-of-bounds access. The front doors check the values where they can (Python, eagerly).
#pragma once

#include "sage/runtime/AttentionCall.h"
#include "sage/runtime/TensorDescription.h"

#include <cstdint>
#include <optional>

namespace sage::runtime {

struct VarlenCall {
  TensorDescription q, k, v;            // 3-D [total, heads, head_dim], the head dim contiguous
  TensorDescription o;                  // q's shape and dtype
  std::optional<TensorDescription> lse; // f32 [heads_q, total_q], contiguous: required iff the kernel writes it
  TensorDescription cu_seqlens_q, cu_seqlens_kv; // i32 [batch + 1], contiguous, on the kernels' device
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;   // >= every sequence's length (and >= 1)
  // Packed calls default to FlashAttention's bottom-right alignment, per sequence.
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;
};

// Throws ArgumentError naming the first argument that does not fit `requirements`. The result's shape is the dense
// problem the kernels run (batch = sequences, tokens_q / tokens_kv = the maxima); its tensors carry batch stride 0
// and `sequences` = {cu_seqlens_q, cu_seqlens_kv, total_q, total_kv}.
ValidatedCall validateVarlenCall(const VarlenCall &call, const KernelRequirements &requirements);

// The dense problem of a packed call of `batch` sequences (workspace sizes; checked as validateVarlenCall checks it).
schedules::ProblemShape varlenProblemShape(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t max_seqlen_q,
                                           int64_t max_seqlen_kv, const KernelRequirements &requirements);

} // namespace sage::runtime
