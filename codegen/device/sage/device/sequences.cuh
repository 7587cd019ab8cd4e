// Which tokens of the caller's tensors a batch index stands for (the attention kernels of sm80, sm90 and sm120). A
// dense call's batch b is its own [tokens_q, tokens_kv] slab; a packed call's (Config::kPackedSequences) is sequence
// b, rows cu_q[b] .. cu_q[b + 1] - 1 of the packed Q/O/LSE and cu_kv[b] .. of K/V (SageSequenceOffsets). The offsets
// are read on the device only (CUDA-graph capture) and clamped, so wrong ones give wrong numbers but never an access
// outside the tensors: both ends into [0, total], the length at least 0 and at most the call's maximum.
#pragma once

namespace sage::device {

struct SequenceExtent {
  int tokens_q, tokens_kv; // the sequence's lengths (dense: the call's tokens_q, tokens_kv)
  int q_base, kv_base;     // its first row in the caller's Q, O, LSE and in K, V (dense: 0)
  int causal_offset;       // key j is visible to row i iff j <= i + causal_offset (SageAttentionParams)
};

// Sequence `batch`'s first row and length from cumulative offsets, clamped as the file's comment says.
__device__ __forceinline__ void clamped_sequence(const int *cumulative, int batch, int total, int maximum, int &base,
                                                 int &length) {
  // Plain loads, not __ldg: a kernel that reads them again in its epilogue (instead of keeping them in registers
  // through its main loop) then really reloads them, where an invariant load could be merged with the first one.
  const int begin = min(max(cumulative[batch], 0), total);
  const int end = min(max(cumulative[batch + 1], 0), total);
  base = begin;
  length = min(max(end - begin, 0), maximum);
}

template <bool kPacked>
__device__ __forceinline__ SequenceExtent sequence_extent(const SageAttentionParams &params, int batch) {
  SequenceExtent extent;
  if constexpr (!kPacked) {
    extent.tokens_q = params.size.tokens_q;
    extent.tokens_kv = params.size.tokens_kv;
    extent.q_base = 0;
    extent.kv_base = 0;
    extent.causal_offset = params.causal_offset;
  } else {
    const SageSequenceOffsets &sequences = params.sequences;
    clamped_sequence(sequences.q, batch, sequences.total_q, params.size.tokens_q, extent.q_base, extent.tokens_q);
    clamped_sequence(sequences.kv, batch, sequences.total_kv, params.size.tokens_kv, extent.kv_base, extent.tokens_kv);
    // Bottom-right alignment is per sequence (FlashAttention's varlen causal mask)
    extent.causal_offset = params.causal_offset + (params.causal_bottom_right ? extent.tokens_kv - extent.tokens_q : 0);
  }
  return extent;
}

} // namespace sage::device
