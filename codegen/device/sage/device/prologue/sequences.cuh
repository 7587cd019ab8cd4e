// Where a batch slot's tokens lie in the caller's Q, K and V, dense or packed (variable-length batches, issue 28).
// Every role reads the caller's rows through `sequenceRows` and takes its number of real tokens from it, so a packed
// slot is written exactly as a dense call of its sequence alone. The prologue generator pastes this header after
// KernelAbi.h, its constants (kPackedSequences) and global_memory.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// The rows of one head of one batch slot: row t of the sequence is at rows + t * token_stride (t < length).
struct SequenceRows {
  const unsigned short *rows;
  long long token_stride;
  int length; // real tokens: the dense tokens_q / tokens_kv, or the packed sequence's length
};

// Sequence `slot` of a packed tensor: cu[slot] .. cu[slot + 1] - 1, both clamped into [0, total] and the length to
// `max_length` (the call's maximum), so that offsets that are wrong give wrong numbers, never a read outside the
// tensor. The host never reads the offsets (CUDA-graph capture). They are read-only for the whole launch (the
// non-coherent path lets the compiler keep or re-read them as registers allow).
__device__ __forceinline__ void packedSequence(const int *offsets, int total, long long slot, int max_length,
                                               long long &first, int &length) {
  const int begin = min(max(__ldg(offsets + slot), 0), total);
  const int end = min(max(__ldg(offsets + slot + 1), 0), total);
  first = begin;
  length = min(max(end - begin, 0), max_length);
}

// Head `head` (= batch slot * heads + head index) of a caller tensor with `tokens` tokens per dense slot. Packed: the
// batch stride is not used (the slot's rows start at cu[slot]); `offsets` / `total` are the tensor's.
__device__ __forceinline__ SequenceRows sequenceRows(const void *tensor, const SageTensorStrides &strides,
                                                     long long head, int heads, [[maybe_unused]] int tokens,
                                                     [[maybe_unused]] const int *offsets, [[maybe_unused]] int total) {
  const long long slot = head / heads;
  long long first = 0;
  int length = tokens;
  long long base = head % heads * strides.head;
  if constexpr (kPackedSequences)
    packedSequence(offsets, total, slot, tokens, first, length);
  else
    base += slot * strides.batch;
  return {(const unsigned short *)tensor + base + first * strides.token, strides.token, length};
}

// The rows of Q head `head` (batch slot * heads_q + head index), of K or V head `head` (batch slot * heads_kv + head
// index).
__device__ __forceinline__ SequenceRows queryRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.q, params.q_strides, head, params.size.heads_q, params.size.tokens_q, params.sequences.q,
                      params.sequences.total_q);
}
__device__ __forceinline__ SequenceRows keyRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.k, params.k_strides, head, params.size.heads_kv, params.size.tokens_kv,
                      params.sequences.kv, params.sequences.total_kv);
}
__device__ __forceinline__ SequenceRows valueRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.v, params.v_strides, head, params.size.heads_kv, params.size.tokens_kv,
                      params.sequences.kv, params.sequences.total_kv);
}
// The number of real K/V tokens of KV head `head`'s slot (what the statistics divide by), without a pointer.
__device__ __forceinline__ int keyLength(const SagePrologueParams &params, long long head) {
  return keyRows(params, head).length;
}

} // namespace sage::device::prologue
