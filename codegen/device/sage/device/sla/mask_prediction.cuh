// SLA's mask prediction (Algorithm 1, lines 5-6) in two launches: the block means of Q and K, then one CTA per row
// of P_c = softmax(pool(Q) pool(K)^T / sqrt(d)) that ranks the row, classes it and writes its lookup tables.
#pragma once

#include "sage/device/sla/common.cuh"

namespace sage::device::sla {

// A row of P_c lives in shared memory: at most this many kv blocks (256k tokens at b_kv = 64).
constexpr int kMaxKvBlocks = 4096;

// Launch 1: the mean over the tokens of one block (a short last block averages what it has), channel by channel.
template <int D, int BLOCK_Q, int BLOCK_KV> __device__ void pool_blocks(const SageSlaPoolParams &p) {
  static_assert(kThreads % D == 0, "D must divide the CTA");
  constexpr int kLanes = kThreads / D; // threads per channel, striding over the block's tokens
  __shared__ float partial[kThreads];
  const int b = blockIdx.z, h = blockIdx.y;
  int block = blockIdx.x;
  const bool is_q = block < p.shape.q_blocks;
  if (!is_q) {
    block -= p.shape.q_blocks;
    if (h >= p.shape.heads_kv)
      return;
  }
  const void *x = is_q ? p.q : p.k;
  const SageSlaStrides strides = is_q ? p.q_strides : p.k_strides;
  const int size = is_q ? BLOCK_Q : BLOCK_KV, tokens = is_q ? p.shape.tokens_q : p.shape.tokens_kv;
  const int begin = block * size, end = min(tokens, begin + size);
  const int c = threadIdx.x % D, lane = threadIdx.x / D;
  float sum = 0.0f;
  for (int t = begin + lane; t < end; t += kLanes)
    sum += load_f16(x, element_index(strides, b, h, t, c));
  partial[threadIdx.x] = sum;
  __syncthreads();
  if (lane != 0)
    return;
  for (int l = 1; l < kLanes; ++l)
    sum += partial[l * D + c];
  const int heads = is_q ? p.shape.heads_q : p.shape.heads_kv, blocks = is_q ? p.shape.q_blocks : p.shape.kv_blocks;
  float *out = is_q ? p.pooled_q : p.pooled_k;
  out[(static_cast<long long>(b * heads + h) * blocks + block) * D + c] = sum / static_cast<float>(end - begin);
}

// Writes, ascending, the kv blocks of a row for which `take(class)` holds into `lut` (warp 0 compacts with ballots).
template <typename Take>
__device__ void compact_row(const signed char *row_classes, int kv_blocks, int *lut, Take take) {
  if (threadIdx.x >= 32)
    return;
  const int lane = threadIdx.x;
  int count = 0;
  for (int base = 0; base < kv_blocks; base += 32) {
    const int j = base + lane;
    const bool selected = j < kv_blocks && take(row_classes[j]);
    const unsigned ballot = __ballot_sync(0xffffffffu, selected);
    if (selected)
      lut[count + __popc(ballot & ((1u << lane) - 1u))] = j;
    count += __popc(ballot);
  }
}

// Launch 2: one row of P_c. Ranks are by the logit descending, ties to the lower kv block (the CPU reference's
// order): rank(j) = #{k : s_k > s_j or (s_k == s_j and k < j)}; the first critical_per_row ranks are critical, the
// last negligible_per_row negligible.
template <int D> __device__ void predict_row(const SageSlaPredictParams &p) {
  __shared__ float logits[kMaxKvBlocks];
  __shared__ signed char row_classes[kMaxKvBlocks];
  __shared__ float q_row[D];
  __shared__ float scratch[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x;
  const int kv_blocks = p.shape.kv_blocks, h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const long long row = (static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.q_blocks + i;
  for (int c = threadIdx.x; c < D; c += kThreads)
    q_row[c] = p.pooled_q[row * D + c];
  __syncthreads();
  const float *k_pool = p.pooled_k + (static_cast<long long>(b) * p.shape.heads_kv + h_kv) * kv_blocks * D;
  float row_max = -__int_as_float(0x7f800000);
  for (int j = threadIdx.x; j < kv_blocks; j += kThreads) {
    float s = 0.0f;
    for (int c = 0; c < D; ++c)
      s += q_row[c] * k_pool[static_cast<long long>(j) * D + c];
    logits[j] = s * p.scale;
    row_max = fmaxf(row_max, logits[j]);
  }
  row_max = block_reduce<true>(row_max, scratch);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < kv_blocks; j += kThreads)
    sum += expf(logits[j] - row_max);
  sum = block_reduce<false>(sum, scratch);
  const long long base = row * kv_blocks;
  for (int j = threadIdx.x; j < kv_blocks; j += kThreads) {
    const float s = logits[j];
    p.compressed[base + j] = expf(s - row_max) / sum;
    int rank = 0;
    for (int k = 0; k < kv_blocks; ++k)
      rank += (logits[k] > s || (logits[k] == s && k < j)) ? 1 : 0;
    const signed char cls = rank < p.shape.critical_per_row                  ? 1
                            : rank >= kv_blocks - p.shape.negligible_per_row ? -1
                                                                             : 0;
    row_classes[j] = cls;
    p.classes[base + j] = cls;
    p.critical_mask[base + j] = cls == 1 ? 1 : 0;
  }
  __syncthreads();
  compact_row(row_classes, kv_blocks, p.critical_lut + row * p.shape.critical_per_row,
              [](signed char cls) { return cls == 1; });
  const int marginal = kv_blocks - p.shape.critical_per_row - p.shape.negligible_per_row;
  const int linear_slots = p.marginal_majority ? kv_blocks - marginal : marginal;
  const bool majority = p.marginal_majority != 0;
  compact_row(row_classes, kv_blocks, p.linear_lut + row * linear_slots,
              [majority](signed char cls) { return majority ? cls != 0 : cls == 0; });
}

} // namespace sage::device::sla
