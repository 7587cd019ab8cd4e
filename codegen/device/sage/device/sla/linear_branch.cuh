// SLA's linear branch (Algorithm 1, lines 4, 13 and 16) and the combined output O = O^s + Proj(O^l).
// A thread owns column c = tid % D and kRows rows of every d x d state (h_j, H_i), so the sums over kv blocks are
// element-wise in registers; rows are shared by a warp, so reads of phi rows in shared memory are broadcasts.
#pragma once

#include "sage/device/sla/common.cuh"

namespace sage::device::sla {

constexpr int kStateChunk = 32;  // tokens of K/V staged at a time by the state kernel
constexpr int kOutputChunk = 16; // q rows staged at a time by the output kernel

template <int D> struct StateTile {
  static_assert((D * D) % kThreads == 0 && kThreads % D == 0, "D must be 16, 32, 64, 128 or 256");
  static constexpr int kRows = D * D / kThreads; // rows of a state per thread
  static constexpr int kGroups = kThreads / D;   // threads per column
  __device__ static int column() { return threadIdx.x % D; }
  __device__ static int first_row() { return (threadIdx.x / D) * kRows; }
};

// Launch 3: h_j = phi(K_j)^T V_j, z_j = colsum(phi(K_j)) for one kv block of one kv head.
template <int D, int BLOCK_KV, int PHI> __device__ void linear_states(const SageSlaStateParams &p) {
  using Tile = StateTile<D>;
  __shared__ float k_phi[kStateChunk][D];
  __shared__ float v_rows[kStateChunk][D];
  const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x;
  const int begin = j * BLOCK_KV, end = min(p.shape.tokens_kv, begin + BLOCK_KV);
  const int c = Tile::column(), a0 = Tile::first_row(), warp = threadIdx.x / 32;
  float acc[Tile::kRows];
  for (int a = 0; a < Tile::kRows; ++a)
    acc[a] = 0.0f;
  float z = 0.0f;
  for (int chunk = begin; chunk < end; chunk += kStateChunk) {
    const int rows = min(kStateChunk, end - chunk);
    for (int e = threadIdx.x; e < kStateChunk * D; e += kThreads) {
      const int r = e / D, col = e % D;
      const bool valid = r < rows;
      k_phi[r][col] = valid ? load_f16(p.k, element_index(p.k_strides, b, h, chunk + r, col)) : 0.0f;
      v_rows[r][col] = valid ? load_f16(p.v, element_index(p.v_strides, b, h, chunk + r, col)) : 0.0f;
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) // rows past the block's end stay 0 (phi(0) is not 0 for elu + 1)
      feature_map_row<D, PHI>(k_phi[r]);
    __syncthreads();
    for (int r = 0; r < rows; ++r) {
      const float v = v_rows[r][c];
      for (int a = 0; a < Tile::kRows; ++a)
        acc[a] += k_phi[r][a0 + a] * v;
    }
    if (threadIdx.x < D)
      for (int r = 0; r < rows; ++r)
        z += k_phi[r][threadIdx.x];
    __syncthreads();
  }
  const long long state = (static_cast<long long>(b) * p.shape.heads_kv + h) * p.shape.kv_blocks + j;
  for (int a = 0; a < Tile::kRows; ++a)
    p.h_states[state * D * D + (a0 + a) * D + c] = acc[a];
  if (threadIdx.x < D)
    p.z_states[state * D + threadIdx.x] = z;
}

// Launch 3b: sum_j h_j and sum_j z_j in block order.
template <int D> __device__ void linear_totals(const SageSlaTotalsParams &p) {
  const int b = blockIdx.z, h = blockIdx.y, e = blockIdx.x * kThreads + threadIdx.x;
  const long long head = static_cast<long long>(b) * p.shape.heads_kv + h;
  if (e < D * D) {
    float sum = 0.0f;
    for (int j = 0; j < p.shape.kv_blocks; ++j)
      sum += p.h_states[(head * p.shape.kv_blocks + j) * D * D + e];
    p.h_total[head * D * D + e] = sum;
  }
  if (blockIdx.x == 0 && threadIdx.x < D) {
    float sum = 0.0f;
    for (int j = 0; j < p.shape.kv_blocks; ++j)
      sum += p.z_states[(head * p.shape.kv_blocks + j) * D + threadIdx.x];
    p.z_total[head * D + threadIdx.x] = sum;
  }
}

// Launch 4: one q block of one q head. H_i = sum of the marginal h_j, or (pre-aggregation) sum of all minus the
// non-marginal ones; O^l_r = phi(q_r) H_i / (phi(q_r) Z_i), 0 where the denominator is 0; O = O^s + O^l W^T + b.
template <int D, int BLOCK_Q, int PHI> __device__ void linear_output(const SageSlaOutputParams &p) {
  using Tile = StateTile<D>;
  __shared__ float z_state[D];
  __shared__ float q_phi[kOutputChunk][D];
  __shared__ float partial[kOutputChunk][Tile::kGroups][D];
  __shared__ float o_linear[kOutputChunk][D];
  __shared__ float denominator[kOutputChunk];
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x;
  const int h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const int c = Tile::column(), a0 = Tile::first_row(), group = threadIdx.x / D, warp = threadIdx.x / 32;
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  const long long row = (static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.q_blocks + i;

  // Line 13 (with pre-aggregation when the marginal blocks are the majority).
  const int marginal = p.shape.kv_blocks - p.shape.critical_per_row - p.shape.negligible_per_row;
  const bool majority = p.marginal_majority != 0;
  const int listed = majority ? p.shape.kv_blocks - marginal : marginal;
  const int *lut = p.linear_lut + row * listed;
  float state[Tile::kRows];
  for (int a = 0; a < Tile::kRows; ++a)
    state[a] = majority ? p.h_total[head_kv * D * D + (a0 + a) * D + c] : 0.0f;
  float z = threadIdx.x < D && majority ? p.z_total[head_kv * D + threadIdx.x] : 0.0f;
  const float sign = majority ? -1.0f : 1.0f;
  for (int n = 0; n < listed; ++n) {
    const long long block = head_kv * p.shape.kv_blocks + lut[n];
    for (int a = 0; a < Tile::kRows; ++a)
      state[a] += sign * p.h_states[block * D * D + (a0 + a) * D + c];
    if (threadIdx.x < D)
      z += sign * p.z_states[block * D + threadIdx.x];
  }
  if (threadIdx.x < D)
    z_state[threadIdx.x] = z;

  // Line 16 and the combination, kOutputChunk rows at a time.
  const int begin = i * BLOCK_Q, end = min(p.shape.tokens_q, begin + BLOCK_Q);
  for (int chunk = begin; chunk < end; chunk += kOutputChunk) {
    const int rows = min(kOutputChunk, end - chunk);
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += kThreads)
      q_phi[e / D][e % D] = load_f16(p.q, element_index(p.q_strides, b, h, chunk + e / D, e % D));
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      feature_map_row<D, PHI>(q_phi[r]);
      float dot = 0.0f;
      for (int a = threadIdx.x % 32; a < D; a += 32)
        dot += q_phi[r][a] * z_state[a];
      dot = warp_sum(dot);
      if (threadIdx.x % 32 == 0)
        denominator[r] = dot;
    }
    __syncthreads();
    for (int r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int a = 0; a < Tile::kRows; ++a)
        sum += q_phi[r][a0 + a] * state[a];
      partial[r][group][c] = sum;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += kThreads) {
      const int r = e / D, col = e % D;
      float numerator = 0.0f;
      for (int g = 0; g < Tile::kGroups; ++g)
        numerator += partial[r][g][col];
      const float value = denominator[r] != 0.0f ? numerator / denominator[r] : 0.0f;
      o_linear[r][col] = value;
      if (p.o_linear)
        p.o_linear[((static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.tokens_q + chunk + r) * D + col] =
            value;
    }
    if (!p.proj_weight)
      continue; // O^s and O^l apart: the caller's Proj (a torch.nn.Linear) combines them
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += kThreads) {
      const int r = e / D, out = e % D;
      float value = p.proj_bias ? p.proj_bias[out] : 0.0f;
      for (int in = 0; in < D; ++in)
        value += o_linear[r][in] * p.proj_weight[out * D + in];
      value += load_f16(p.o_sparse, element_index(p.o_sparse_strides, b, h, chunk + r, out));
      store_f16(p.out, element_index(p.out_strides, b, h, chunk + r, out), value);
    }
  }
}

} // namespace sage::device::sla
