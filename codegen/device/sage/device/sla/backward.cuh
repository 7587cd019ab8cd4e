// SLA's backward (Algorithm 2) of the exact formula: the linear branch's kernels, on CUDA cores. Proj is its owner's
// to differentiate: these kernels take dO^s and dO^l. The linear branch reads the forward's h_j, z_j (and totals) and
// lookup tables; the rows and kv kernels here write dQ, dK and dV, to which the sparse part's tensor-core kernels
// (sparse_backward.cuh: L and D^s recomputed over the critical blocks) add afterwards.
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/linear_branch.cuh"

namespace sage::device::sla {

// Rows (or tokens) staged at a time: with the d x d dynamic state, shared memory fits sm_89's 99 KiB at d = 128.
constexpr int kBackwardChunk = 8;

// The d x d state in shared memory has rows of D + 1 floats: the loops below read it along rows and along columns
// across a warp's lanes, and a stride of D would put a column's 32 elements in one bank.
template <int D> constexpr int kStateStride = D + 1;

// The chunk loops below give a thread one column (or state row) x = tid % D and the chunk's rows tid / D + m kRowStep:
// the state's element is read once for kRowsPerThread rows, the rows four floats at a time.
template <int D> struct ChunkRows {
  static constexpr int kRowStep = kThreads / D;
  static constexpr int kRowsPerThread = (kBackwardChunk + kRowStep - 1) / kRowStep;
  __device__ static int x() { return threadIdx.x % D; }
  __device__ static int row(int m) { return static_cast<int>(threadIdx.x) / D + kRowStep * m; }
};

template <int D> __device__ __forceinline__ float4 row4(const float (&row)[D], int at) {
  return *reinterpret_cast<const float4 *>(&row[at]);
}

// Launch 1: the column lookup tables, ascending in the q block, by warp-ballot compaction.
__device__ inline void column_tables(const SageSlaColumnsParams &p) {
  if (threadIdx.x >= 32)
    return;
  const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x, lane = threadIdx.x;
  const int q_blocks = p.shape.q_blocks, kv_blocks = p.shape.kv_blocks;
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const long long column = head * kv_blocks + j;
  int counts[3] = {0, 0, 0};
  int *lists[3] = {p.critical_columns + column * q_blocks, p.marginal_columns + column * q_blocks,
                   p.non_marginal_columns + column * q_blocks};
  for (int base = 0; base < q_blocks; base += 32) {
    const int i = base + lane;
    const signed char cls = i < q_blocks ? p.classes[(head * q_blocks + i) * kv_blocks + j] : 2;
    const bool take[3] = {cls == 1, cls == 0, i < q_blocks && cls != 0};
    for (int list = 0; list < 3; ++list) {
      const unsigned ballot = __ballot_sync(0xffffffffu, take[list]);
      if (take[list])
        lists[list][counts[list] + __popc(ballot & ((1u << lane) - 1u))] = i;
      counts[list] += __popc(ballot);
    }
  }
  if (lane < 3)
    p.column_counts[column * 3 + lane] = counts[lane];
}

// Launch 2: one q block of one q head: the linear branch's dQ (written), dH_i and dZ_i.
template <int D, int BLOCK_Q, int BLOCK_KV, int PHI> __device__ void rows_backward(const SageSlaRowsBackwardParams &p) {
  using Tile = StateTile<D>;
  extern __shared__ float h_state[]; // H_i [D][kStateStride<D>]
  __shared__ float z_state[D];
  __shared__ __align__(16) float q_raw[kBackwardChunk][D], q_phi[kBackwardChunk][D], d_linear[kBackwardChunk][D];
  __shared__ float work[kBackwardChunk][D]; // O^l, then dx of phi
  __shared__ float d_phi[kBackwardChunk][D];
  __shared__ float denominator[kBackwardChunk], delta_linear[kBackwardChunk];
  __shared__ float scale_scratch[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c = Tile::column(), a0 = Tile::first_row();
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const long long row_block = head * p.shape.q_blocks + i;

  // H_i, Z_i as the forward built and kept them (line 13, with pre-aggregation).
  {
    using Sum = ScaledStateSum<D>;
    float state[Sum::kVectorsPerThread][8];
    Sum::clear(state);
    Sum::add_one(state, p.h_rows, p.h_row_scales, row_block);
    Sum::template store_f32<kStateStride<D>>(h_state, state);
    if (threadIdx.x < D)
      z_state[threadIdx.x] = p.z_rows[row_block * D + threadIdx.x];
  }

  // The linear branch (lines 4-5): dH_i, dZ_i and dQ through d phi(Q).
  float dh[Tile::kRows];
  for (int a = 0; a < Tile::kRows; ++a)
    dh[a] = 0.0f;
  float dz = 0.0f;
  const int begin = i * BLOCK_Q, end = min(p.shape.tokens_q, begin + BLOCK_Q);
  for (int chunk = begin; chunk < end; chunk += kBackwardChunk) {
    const int rows = min(kBackwardChunk, end - chunk);
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += kThreads) {
      const int r = e / D, col = e % D;
      q_raw[r][col] = load_f16(p.q, element_index(p.q_strides, b, h, chunk + r, col));
      q_phi[r][col] = q_raw[r][col];
      d_linear[r][col] = p.d_linear[(head * p.shape.tokens_q + chunk + r) * D + col];
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      feature_map_row<D, PHI>(q_phi[r]);
      float dot = 0.0f;
      for (int a = lane; a < D; a += 32)
        dot += q_phi[r][a] * z_state[a];
      dot = warp_sum(dot);
      if (lane == 0)
        denominator[r] = dot;
    }
    __syncthreads();
    { // O^l = phi(q) H / den
      using Rows = ChunkRows<D>;
      const int col = Rows::x();
      float numerator[Rows::kRowsPerThread] = {};
      for (int a = 0; a < D; a += 4) {
        float column[4];
        for (int k = 0; k < 4; ++k)
          column[k] = h_state[(a + k) * kStateStride<D> + col];
        for (int m = 0; m < Rows::kRowsPerThread; ++m)
          if (Rows::row(m) < rows) {
            const float4 q = row4<D>(q_phi[Rows::row(m)], a);
            numerator[m] += q.x * column[0] + q.y * column[1] + q.z * column[2] + q.w * column[3];
          }
      }
      for (int m = 0; m < Rows::kRowsPerThread; ++m) {
        const int r = Rows::row(m);
        if (r < rows)
          work[r][col] = denominator[r] != 0.0f ? numerator[m] / denominator[r] : 0.0f;
      }
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) { // D^l = rowsum(dO^l o O^l)
      float dot = 0.0f;
      for (int col = lane; col < D; col += 32)
        dot += d_linear[r][col] * work[r][col];
      dot = warp_sum(dot);
      if (lane == 0)
        delta_linear[r] = dot;
    }
    __syncthreads();
    { // d phi(Q) = (dO^l H^T - D^l Z^T) / den
      using Rows = ChunkRows<D>;
      const int a = Rows::x();
      float sum[Rows::kRowsPerThread] = {};
      for (int col = 0; col < D; col += 4) {
        float state_row[4];
        for (int k = 0; k < 4; ++k)
          state_row[k] = h_state[a * kStateStride<D> + col + k];
        for (int m = 0; m < Rows::kRowsPerThread; ++m)
          if (Rows::row(m) < rows) {
            const float4 g = row4<D>(d_linear[Rows::row(m)], col);
            sum[m] += g.x * state_row[0] + g.y * state_row[1] + g.z * state_row[2] + g.w * state_row[3];
          }
      }
      for (int m = 0; m < Rows::kRowsPerThread; ++m) {
        const int r = Rows::row(m);
        if (r < rows) {
          d_phi[r][a] = denominator[r] != 0.0f ? (sum[m] - delta_linear[r] * z_state[a]) / denominator[r] : 0.0f;
          work[r][a] = 0.0f;
        }
      }
    }
    for (int r = 0; r < rows; ++r) { // dH_i += (phi(q)/den)^T dO^l, dZ_i -= (phi(q)/den)^T D^l
      const float weight = denominator[r] != 0.0f ? 1.0f / denominator[r] : 0.0f;
      const float g = d_linear[r][c] * weight;
      if constexpr (Tile::kRows % 4 == 0) { // phi(q)'s row four floats at a time
        for (int a = 0; a < Tile::kRows; a += 4) {
          const float4 q = row4<D>(q_phi[r], a0 + a);
          dh[a] += q.x * g;
          dh[a + 1] += q.y * g;
          dh[a + 2] += q.z * g;
          dh[a + 3] += q.w * g;
        }
      } else {
        for (int a = 0; a < Tile::kRows; ++a)
          dh[a] += q_phi[r][a0 + a] * g;
      }
      if (threadIdx.x < D)
        dz -= q_phi[r][threadIdx.x] * weight * delta_linear[r];
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      feature_map_backward_row<D, PHI>(q_raw[r], q_phi[r], d_phi[r], work[r]);
      for (int col = lane; col < D; col += 32)
        p.dq[(head * p.shape.tokens_q + chunk + r) * D + col] = work[r][col];
    }
  }
  // dH_i in f16 with a power-of-two scale (as the states): half the bytes the kv kernel sums per listed q block.
  float largest = 0.0f;
  for (int a = 0; a < Tile::kRows; ++a)
    largest = fmaxf(largest, fabsf(dh[a]));
  const float factor = f16_range_factor(block_reduce<true>(largest, scale_scratch));
  for (int a = 0; a < Tile::kRows; ++a)
    p.dh_rows[row_block * D * D + (a0 + a) * D + c] = f16_bits(dh[a] * factor);
  if (threadIdx.x == 0)
    p.dh_scales[row_block] = 1.0f / factor;
  if (threadIdx.x < D)
    p.dz_rows[row_block * D + threadIdx.x] = dz;
}

// Launch 3: sum_i dZ_i per q head, in block order.
template <int D> __device__ void row_totals(const SageSlaRowTotalsParams &p) {
  const long long head = static_cast<long long>(blockIdx.z) * p.shape.heads_q + blockIdx.y;
  if (threadIdx.x < D) {
    float sum = 0.0f;
    for (int i = 0; i < p.shape.q_blocks; ++i)
      sum += p.dz_rows[(head * p.shape.q_blocks + i) * D + threadIdx.x];
    p.dz_total[head * D + threadIdx.x] = sum;
  }
}

// Launch 4: one kv block of one kv head. dh_j = sum of dH_i over the q blocks (of every q head of the GQA group)
// where the block is marginal, from the mask GEMM (launch 3c; for a column it flagged, from the column tables, all
// minus the others when marginal blocks are the column's majority), then d phi(K_t) = dh_j V_t + dz_j and dV_t =
// phi(K_t) dh_j (line 17), written; the sparse part's kv kernel adds to them.
template <int D, int BLOCK_Q, int BLOCK_KV, int PHI>
__device__ void columns_backward(const SageSlaColumnsBackwardParams &p) {
  extern __shared__ float dh_state[]; // dh_j [D][kStateStride<D>]
  __shared__ float dz_state[D];
  __shared__ __align__(16) float k_raw[kBackwardChunk][D], k_phi[kBackwardChunk][D], v_rows[kBackwardChunk][D];
  __shared__ float dk_phi[kBackwardChunk][D], dk_lin[kBackwardChunk][D];
  __shared__ float list_scratch[kThreads];
  const int b = blockIdx.z, h_kv = blockIdx.y, j = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = p.shape.heads_q / p.shape.heads_kv;
  const int q_blocks = p.shape.q_blocks;
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;

  {
    using Sum = ScaledStateSum<D>;
    float dh[Sum::kVectorsPerThread][8];
    Sum::clear(dh);
    float dz = 0.0f;
    // dh_j from the mask GEMM unless it flagged this column; dz_j (d floats per listed q block) from the tables.
    const long long kv_column = head_kv * p.shape.kv_blocks + j;
    const bool from_gemm = p.dh_sums && p.dh_sum_fallback[kv_column] == 0; // the same for the whole CTA
    if (from_gemm)
      Sum::add_f32(dh, p.dh_sums + kv_column * D * D);
    for (int h = h_kv * group; h < (h_kv + 1) * group; ++h) {
      const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
      const long long column = head * p.shape.kv_blocks + j;
      const int marginal = p.column_counts[column * 3 + 1], non_marginal = p.column_counts[column * 3 + 2];
      const bool majority = 2 * marginal > q_blocks;
      const int *list = (majority ? p.non_marginal_columns : p.marginal_columns) + column * q_blocks;
      const int listed = majority ? non_marginal : marginal;
      const float sign = majority ? -1.0f : 1.0f;
      if (majority && threadIdx.x < D)
        dz += p.dz_total[head * D + threadIdx.x];
      if (from_gemm) {
        dz += sign * sum_listed_vectors<D>(p.dz_rows, head * q_blocks, list, listed, list_scratch);
        continue;
      }
      if (majority) // a flagged column (rare): every dH_i of the head, minus the listed ones below
        for (int i = 0; i < q_blocks; ++i)
          Sum::add_one(dh, p.dh_rows, p.dh_scales, head * q_blocks + i);
      Sum::add_listed(dh, p.dh_rows, p.dh_scales, head * q_blocks, list, listed, sign, [&](long long row_block) {
        if (threadIdx.x < D)
          dz += sign * p.dz_rows[row_block * D + threadIdx.x];
      });
    }
    Sum::template store_f32<kStateStride<D>>(dh_state, dh);
    if (threadIdx.x < D)
      dz_state[threadIdx.x] = dz;
  }

  const int begin = j * BLOCK_KV, end = min(p.shape.tokens_kv, begin + BLOCK_KV);
  for (int chunk = begin; chunk < end; chunk += kBackwardChunk) {
    const int rows = min(kBackwardChunk, end - chunk);
    __syncthreads();
    for (int e = threadIdx.x; e < rows * D; e += kThreads) {
      const int r = e / D, col = e % D;
      k_raw[r][col] = load_f16(p.k, element_index(p.k_strides, b, h_kv, chunk + r, col));
      k_phi[r][col] = k_raw[r][col];
      v_rows[r][col] = load_f16(p.v, element_index(p.v_strides, b, h_kv, chunk + r, col));
      dk_lin[r][col] = 0.0f;
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps)
      feature_map_row<D, PHI>(k_phi[r]);
    __syncthreads();
    {
      using Rows = ChunkRows<D>;
      const int x = Rows::x(); // the feature a for dK, the channel c for dV
      float dk_sum[Rows::kRowsPerThread], dv_sum[Rows::kRowsPerThread];
      for (int m = 0; m < Rows::kRowsPerThread; ++m) {
        dk_sum[m] = dz_state[x];
        dv_sum[m] = 0.0f;
      }
      for (int y = 0; y < D; y += 4) {
        float state_row[4], state_column[4];
        for (int k = 0; k < 4; ++k) {
          state_row[k] = dh_state[x * kStateStride<D> + y + k];
          state_column[k] = dh_state[(y + k) * kStateStride<D> + x];
        }
        for (int m = 0; m < Rows::kRowsPerThread; ++m)
          if (Rows::row(m) < rows) {
            const float4 v = row4<D>(v_rows[Rows::row(m)], y), k = row4<D>(k_phi[Rows::row(m)], y);
            dk_sum[m] += v.x * state_row[0] + v.y * state_row[1] + v.z * state_row[2] + v.w * state_row[3];
            dv_sum[m] += k.x * state_column[0] + k.y * state_column[1] + k.z * state_column[2] + k.w * state_column[3];
          }
      }
      for (int m = 0; m < Rows::kRowsPerThread; ++m) {
        const int r = Rows::row(m);
        if (r < rows) {
          dk_phi[r][x] = dk_sum[m];
          p.dv[(head_kv * p.shape.tokens_kv + chunk + r) * D + x] = dv_sum[m];
        }
      }
    }
    __syncthreads();
    for (int r = warp; r < rows; r += kWarps) {
      feature_map_backward_row<D, PHI>(k_raw[r], k_phi[r], dk_phi[r], dk_lin[r]);
      for (int col = lane; col < D; col += 32)
        p.dk[(head_kv * p.shape.tokens_kv + chunk + r) * D + col] = dk_lin[r][col];
    }
  }
}

} // namespace sage::device::sla
