// SLA's linear branch (Algorithm 1, lines 4, 13 and 16) and the combined output O = O^s + Proj(O^l).
// The matrix products (h_j = phi(K_j)^T V_j, phi(Q_i) H_i, O^l W^T) run on tensor cores with split f16 operands
// (tensor_core.cuh); the states are stored in f16 with a power-of-two scale per block, so H_i's sum over the listed
// blocks (the output kernel's memory traffic) reads 2 bytes per element, 16 bytes per load, f32 in registers.
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

constexpr int kStateChunk = 32; // tokens of K/V staged at a time by the state kernel (a multiple of 16)

// The backward's rows kernel accumulates dH_i with one thread per column and kRows rows of the d x d matrix.
template <int D> struct StateTile {
  static_assert((D * D) % kThreads == 0 && kThreads % D == 0, "D must be 16, 32, 64, 128 or 256");
  static constexpr int kRows = D * D / kThreads; // rows of a state per thread
  static constexpr int kGroups = kThreads / D;   // threads per column
  __device__ static int column() { return threadIdx.x % D; }
  __device__ static int first_row() { return (threadIdx.x / D) * kRows; }
};

// Splits 8 consecutive values into hi and lo f16 parts and stores each part as one 16-byte vector.
__device__ __forceinline__ void store_split8(const float (&values)[8], float factor, unsigned short *hi,
                                             unsigned short *lo) {
  unsigned short h[8], l[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    split_f16(values[e] * factor, h[e], l[e]);
  *reinterpret_cast<uint4 *>(hi) =
      make_uint4(pack_f16x2(h[0], h[1]), pack_f16x2(h[2], h[3]), pack_f16x2(h[4], h[5]), pack_f16x2(h[6], h[7]));
  *reinterpret_cast<uint4 *>(lo) =
      make_uint4(pack_f16x2(l[0], l[1]), pack_f16x2(l[2], l[3]), pack_f16x2(l[4], l[5]), pack_f16x2(l[6], l[7]));
}

// The power of two that brings max |x| (finite, > 0) into [2^14, 2^15): 2^-e for max = m 2^e, m in [0.5, 1).
__device__ __forceinline__ float f16_range_factor(float largest) {
  if (!(largest > 0.0f) || isinf(largest))
    return 1.0f;
  int exponent = 0;
  frexpf(largest, &exponent);
  return ldexpf(1.0f, 15 - exponent);
}

// Launch 3: h_j = phi(K_j)^T V_j, z_j = colsum(phi(K_j)) for one kv block of one kv head. Every warp owns a fixed set
// of 16 x 8 tiles of h_j (f32 accumulators across the block's chunks); phi(K) is split in f16 hi + lo, V is f16.
template <int D, int BLOCK_KV, int PHI> __device__ void linear_states(const SageSlaStateParams &p) {
  static_assert(D % 16 == 0, "the tensor-core tiles take D in steps of 16");
  constexpr int kStride = D + 8, kPerLane = (D + 31) / 32;
  constexpr int kTiles = (D / 16) * (D / 8), kTilesPerWarp = (kTiles + kWarps - 1) / kWarps;
  __shared__ __align__(16) unsigned short k_hi[kStateChunk * kStride], k_lo[kStateChunk * kStride];
  __shared__ __align__(16) unsigned short v_rows[kStateChunk * kStride];
  __shared__ float z_partial[kWarps][D];
  __shared__ float scratch[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int begin = j * BLOCK_KV, end = min(p.shape.tokens_kv, begin + BLOCK_KV);
  float acc[kTilesPerWarp][4];
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[t][e] = 0.0f;
  float z[kPerLane];
#pragma unroll
  for (int u = 0; u < kPerLane; ++u)
    z[u] = 0.0f;
  const SharedF16 a_hi{k_hi, kStride}, a_lo{k_lo, kStride}, b_v{v_rows, kStride};
  for (int chunk = begin; chunk < end; chunk += kStateChunk) {
    const int rows = min(kStateChunk, end - chunk);
    __syncthreads(); // the previous chunk's products are done
    for (int r = warp; r < kStateChunk; r += kWarps) {
      // Rows past the block's end stay 0 in phi(K) and V (phi(0) is not 0 for elu + 1).
      float x[kPerLane];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        x[u] = r < rows && c < D ? load_f16(p.k, element_index(p.k_strides, b, h, chunk + r, c)) : 0.0f;
      }
      if (r < rows)
        feature_map_lanes<D, PHI>(x);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        if (c >= D)
          continue;
        z[u] += x[u];
        split_f16(x[u], k_hi[r * kStride + c], k_lo[r * kStride + c]);
        v_rows[r * kStride + c] =
            r < rows ? static_cast<const unsigned short *>(p.v)[element_index(p.v_strides, b, h, chunk + r, c)] : 0;
      }
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile < kTiles) // A = phi(K)^T is stored [token][feature], B = V [token][feature]: both k-major
        mma_tile_split_a<kStateChunk, true, true>(acc[t], a_hi, a_lo, b_v, (tile / (D / 8)) * 16, (tile % (D / 8)) * 8);
    }
  }

// z_j in a fixed order (deterministic), the scale s_j, then h_j / s_j in f16.
#pragma unroll
  for (int u = 0; u < kPerLane; ++u)
    if (lane + 32 * u < D)
      z_partial[warp][lane + 32 * u] = z[u];
  float largest = 0.0f;
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      largest = fmaxf(largest, fabsf(acc[t][e]));
  largest = block_reduce<true>(largest, scratch); // its barriers also publish z_partial
  const float factor = f16_range_factor(largest);
  const long long state = (static_cast<long long>(b) * p.shape.heads_kv + h) * p.shape.kv_blocks + j;
  if (threadIdx.x < D) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      sum += z_partial[w][threadIdx.x];
    p.z_states[state * D + threadIdx.x] = sum;
  }
  if (threadIdx.x == 0)
    p.h_scales[state] = 1.0f / factor; // exact: a power of two
  unsigned *out = reinterpret_cast<unsigned *>(p.h_states + state * D * D);
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t) {
    const int tile = warp + kWarps * t;
    if (tile >= kTiles)
      continue;
    const int row = (tile / (D / 8)) * 16 + tile_row(), col = (tile % (D / 8)) * 8 + tile_col();
    out[(row * D + col) / 2] = pack_f16x2(f16_bits(acc[t][0] * factor), f16_bits(acc[t][1] * factor));
    out[((row + 8) * D + col) / 2] = pack_f16x2(f16_bits(acc[t][2] * factor), f16_bits(acc[t][3] * factor));
  }
}

// Launch 3b: sum_j z_j in block order, in f32 (Z_i with pre-aggregation: the total minus the listed z_j).
template <int D> __device__ void linear_totals(const SageSlaTotalsParams &p) {
  const long long head = static_cast<long long>(blockIdx.z) * p.shape.heads_kv + blockIdx.y;
  if (threadIdx.x < D) {
    float sum = 0.0f;
    for (int j = 0; j < p.shape.kv_blocks; ++j)
      sum += p.z_states[(head * p.shape.kv_blocks + j) * D + threadIdx.x];
    p.z_total[head * D + threadIdx.x] = sum;
  }
}

__device__ __forceinline__ void accumulate_f16x8(float (&sum)[8], uint4 bits, float coefficient) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    sum[2 * w] = fmaf(coefficient, f16_value(static_cast<unsigned short>(words[w] & 0xffffu)), sum[2 * w]);
    sum[2 * w + 1] = fmaf(coefficient, f16_value(static_cast<unsigned short>(words[w] >> 16)), sum[2 * w + 1]);
  }
}

// sum over n < count of vectors[(first + list[n]) * D + c] for c = threadIdx.x < D (the other threads get 0), by the
// whole CTA (it has barriers): kThreads / D groups of D threads take every (kThreads / D)-th entry with four loads in
// flight each, instead of one thread per column waiting for list[n], then its vector, per entry (77 round trips to L2
// per q block at 95% sparsity). `scratch`: kThreads floats of shared memory, free on entry.
template <int D>
__device__ float sum_listed_vectors(const float *vectors, long long first, const int *list, int count, float *scratch) {
  constexpr int kGroups = kThreads / D;
  static_assert(kThreads % D == 0, "D divides the CTA");
  const int column = threadIdx.x % D, group = threadIdx.x / D;
  const float *base = vectors + first * D + column;
  float sum = 0.0f;
  int n = group;
  for (; n + 3 * kGroups < count; n += 4 * kGroups) {
    const int j0 = list[n], j1 = list[n + kGroups], j2 = list[n + 2 * kGroups], j3 = list[n + 3 * kGroups];
    const float a = base[static_cast<long long>(j0) * D], b = base[static_cast<long long>(j1) * D];
    const float c = base[static_cast<long long>(j2) * D], d = base[static_cast<long long>(j3) * D];
    sum += a;
    sum += b;
    sum += c;
    sum += d;
  }
  for (; n < count; n += kGroups)
    sum += base[static_cast<long long>(list[n]) * D];
  scratch[threadIdx.x] = sum;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < D)
    for (int g = 0; g < kGroups; ++g)
      total += scratch[g * D + threadIdx.x];
  __syncthreads(); // scratch is free again
  return total;
}

// Sums of d x d matrices stored in f16 with one f32 scale each (h_j, dH_i), in f32 registers: a thread owns
// kVectorsPerThread runs of 8 consecutive elements (row-major), read 16 bytes at a time.
template <int D> struct ScaledStateSum {
  static constexpr int kVectors = D * D / 8;
  static constexpr int kVectorsPerThread = (kVectors + kThreads - 1) / kThreads;
  __device__ static bool owns(int v) { return v * kThreads + static_cast<int>(threadIdx.x) < kVectors; }
  __device__ static int first_element(int v) { return (v * kThreads + threadIdx.x) * 8; }

  __device__ static void clear(float (&sum)[kVectorsPerThread][8]) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sum[v][e] = 0.0f;
  }

  // sum += matrix (f32, row-major, 16-byte aligned)
  __device__ static void add_f32(float (&sum)[kVectorsPerThread][8], const float *matrix) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v)) {
        const float4 left = *reinterpret_cast<const float4 *>(matrix + first_element(v));
        const float4 right = *reinterpret_cast<const float4 *>(matrix + first_element(v) + 4);
        sum[v][0] += left.x, sum[v][1] += left.y, sum[v][2] += left.z, sum[v][3] += left.w;
        sum[v][4] += right.x, sum[v][5] += right.y, sum[v][6] += right.z, sum[v][7] += right.w;
      }
  }

  // sum += scales[m] * states[m]
  __device__ static void add_one(float (&sum)[kVectorsPerThread][8], const unsigned short *states, const float *scales,
                                 long long matrix) {
    const uint4 *vectors = reinterpret_cast<const uint4 *>(states);
    const float coefficient = scales[matrix];
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v))
        accumulate_f16x8(sum[v], __ldg(vectors + matrix * kVectors + v * kThreads + threadIdx.x), coefficient);
  }

  // sum += sign * sum over n < count of scales[m] * states[m], m = first + list[n]; each_matrix(m) too (the vectors
  // z_j, dZ_i). All of a matrix's loads are issued before its adds; the other warps of the SM cover the latency.
  template <typename EachMatrix>
  __device__ static void add_listed(float (&sum)[kVectorsPerThread][8], const unsigned short *states,
                                    const float *scales, long long first, const int *list, int count, float sign,
                                    EachMatrix each_matrix) {
    const uint4 *vectors = reinterpret_cast<const uint4 *>(states);
    for (int n = 0; n < count; ++n) {
      const long long matrix = first + list[n];
      uint4 bits[kVectorsPerThread];
#pragma unroll
      for (int v = 0; v < kVectorsPerThread; ++v)
        if (owns(v))
          bits[v] = __ldg(vectors + matrix * kVectors + v * kThreads + threadIdx.x);
      const float coefficient = sign * scales[matrix];
      each_matrix(matrix);
#pragma unroll
      for (int v = 0; v < kVectorsPerThread; ++v)
        if (owns(v))
          accumulate_f16x8(sum[v], bits[v], coefficient);
    }
  }

  // matrix (f32, row-major, rows of kStride elements) = sum
  template <int kStride> __device__ static void store_f32(float *matrix, const float (&sum)[kVectorsPerThread][8]) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v)) {
        const int row = first_element(v) / D, column = first_element(v) % D;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          matrix[row * kStride + column + e] = sum[v][e];
      }
  }
};

// The output kernel's shared memory (abi.cuh's sage_sla_output_* give the host the same numbers).
template <int D, int BLOCK_Q> struct OutputLayout {
  static constexpr int kRows = sage_sla_output_rows(BLOCK_Q); // q rows, padded to whole 16-row tiles
  static constexpr int kColumns = D < 64 ? D : 64;            // output columns per pass of a product
  static constexpr int kPasses = D / kColumns;
  static constexpr int kRowStride = D + 8;          // phi(Q), O^l and Proj's weight rows
  static constexpr int kStateStride = kColumns + 8; // a column slice of H_i
  static constexpr int kOperandHalves = sage_sla_output_operand_halves(D);
  static constexpr int kRowHalves = kRows * kRowStride;
  static constexpr int kTiles = (kRows / 16) * (kColumns / 8); // per pass
  static constexpr int kTilesPerWarp = (kTiles + kWarps - 1) / kWarps;
  static constexpr int kVectors = ScaledStateSum<D>::kVectors; // 16-byte pieces of an f16 state
  static constexpr int kVectorsPerThread = ScaledStateSum<D>::kVectorsPerThread;
  static_assert(D % 16 == 0 && D <= 128, "D must be 16, 32, 64 or 128");
  static_assert(2 * (2 * kOperandHalves + 2 * kRowHalves) + 4 * (D + kRows + kWarps) ==
                    sage_sla_output_shared_bytes(D, BLOCK_Q),
                "abi.cuh's size of the output kernel's shared memory");
};

// Launch 4: one q block of one q head. H_i from the mask GEMM or, for the rows it flagged, the sum of the marginal
// h_j (or with pre-aggregation the sum of all minus the non-marginal ones), in f32 registers (each thread owns
// kVectorsPerThread runs of 8 elements, read 16 bytes at a time); O^l_r = phi(q_r) H_i / (phi(q_r) Z_i), 0 where the
// denominator is 0; O = O^s + O^l W^T + b. H_i is scaled by a power of two into f16's range before it is split (the
// ratio does not change).
template <int D, int BLOCK_Q, int PHI> __device__ void linear_output(const SageSlaOutputParams &p) {
  using L = OutputLayout<D, BLOCK_Q>;
  constexpr int kPerLane = (D + 31) / 32;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *operand_hi = reinterpret_cast<unsigned short *>(shared_bytes); // H_i's slice, then W's rows
  unsigned short *operand_lo = operand_hi + L::kOperandHalves;
  unsigned short *rows_hi = operand_lo + L::kOperandHalves; // phi(Q_i), then O^l
  unsigned short *rows_lo = rows_hi + L::kRowHalves;
  float *z_state = reinterpret_cast<float *>(rows_lo + L::kRowHalves);
  float *denominator = z_state + D;
  float *scratch = denominator + L::kRows;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  const long long row = (static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.q_blocks + i;
  const int begin = i * BLOCK_Q, end = min(p.shape.tokens_q, begin + BLOCK_Q);

  // Line 13. H_i comes from the mask GEMM (launch 3c) unless it flagged this row; then, and for Z_i (d floats per
  // listed block), the lookup table: the marginal blocks, or with pre-aggregation (marginal blocks the majority) the
  // sum of all blocks minus the non-marginal ones (Z_i from z_total; a flagged row sums every h_j itself).
  const int marginal = p.shape.kv_blocks - p.shape.critical_per_row - p.shape.negligible_per_row;
  const bool majority = p.marginal_majority != 0;
  const bool from_gemm = p.h_sums && p.h_sum_fallback[row] == 0; // the same for the whole CTA
  const int listed = majority ? p.shape.kv_blocks - marginal : marginal;
  const int *lut = p.linear_lut + row * listed;
  float state[L::kVectorsPerThread][8];
#pragma unroll
  for (int v = 0; v < L::kVectorsPerThread; ++v) {
    const int piece = v * kThreads + threadIdx.x;
    if (from_gemm && piece < L::kVectors) {
      const float4 *sum = reinterpret_cast<const float4 *>(p.h_sums + row * D * D + piece * 8);
      const float4 left = __ldg(sum), right = __ldg(sum + 1);
      state[v][0] = left.x, state[v][1] = left.y, state[v][2] = left.z, state[v][3] = left.w;
      state[v][4] = right.x, state[v][5] = right.y, state[v][6] = right.z, state[v][7] = right.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        state[v][e] = 0.0f;
    }
  }
  if (!from_gemm && majority) // a flagged row (rare): every state, then minus the listed ones below
    for (int j = 0; j < p.shape.kv_blocks; ++j)
      ScaledStateSum<D>::add_one(state, p.h_states, p.h_scales, head_kv * p.shape.kv_blocks + j);
  const float sign = majority ? -1.0f : 1.0f;
  // Scratch: the operands' buffers (with operand_lo at least kThreads floats), free until the first pass.
  const float z_listed = sum_listed_vectors<D>(p.z_states, head_kv * p.shape.kv_blocks, lut, listed,
                                               reinterpret_cast<float *>(operand_hi));
  const float z = threadIdx.x < D ? (majority ? p.z_total[head_kv * D + threadIdx.x] : 0.0f) + sign * z_listed : 0.0f;
  const uint4 *states = reinterpret_cast<const uint4 *>(p.h_states);
  for (int n = 0; n < (from_gemm ? 0 : listed); ++n) {
    const long long block = head_kv * p.shape.kv_blocks + lut[n];
    // All of a block's loads are issued before its adds; the other warps of the SM (2 CTAs) cover the latency.
    uint4 bits[L::kVectorsPerThread];
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors)
        bits[v] = __ldg(states + block * L::kVectors + v * kThreads + threadIdx.x);
    const float coefficient = sign * p.h_scales[block];
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors)
        accumulate_f16x8(state[v], bits[v], coefficient);
  }
  if (threadIdx.x < D)
    z_state[threadIdx.x] = z;
  float largest = 0.0f;
#pragma unroll
  for (int v = 0; v < L::kVectorsPerThread; ++v)
#pragma unroll
    for (int e = 0; e < 8; ++e)
      largest = fmaxf(largest, fabsf(state[v][e]));
  const float factor = f16_range_factor(block_reduce<true>(largest, scratch)); // also publishes z_state
  if (p.h_rows) { // kept for the backward, in the states' format
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors) {
        unsigned words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
          words[w] = pack_f16x2(f16_bits(state[v][2 * w] * factor), f16_bits(state[v][2 * w + 1] * factor));
        reinterpret_cast<uint4 *>(p.h_rows)[row * L::kVectors + v * kThreads + threadIdx.x] =
            make_uint4(words[0], words[1], words[2], words[3]);
      }
    if (threadIdx.x == 0)
      p.h_row_scales[row] = 1.0f / factor;
    if (threadIdx.x < D)
      p.z_rows[row * D + threadIdx.x] = z;
  }

  // Line 16's rows: phi(q_r) split into f16 hi + lo, and the denominator phi(q_r) Z_i in f32 (scaled as H_i is).
  for (int r = warp; r < L::kRows; r += kWarps) {
    const bool valid = begin + r < end;
    float x[kPerLane];
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int c = lane + 32 * u;
      x[u] = valid && c < D ? load_f16(p.q, element_index(p.q_strides, b, h, begin + r, c)) : 0.0f;
    }
    if (valid)
      feature_map_lanes<D, PHI>(x);
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < kPerLane; ++u) {
      const int c = lane + 32 * u;
      if (c < D) {
        dot += x[u] * z_state[c];
        split_f16(x[u], rows_hi[r * L::kRowStride + c], rows_lo[r * L::kRowStride + c]);
      }
    }
    dot = warp_sum(dot);
    if (lane == 0)
      denominator[r] = valid ? dot * factor : 0.0f;
  }

  // phi(Q_i) H_i, kColumns output columns per pass; O^l stays in registers for Proj.
  const SharedF16 q_hi{rows_hi, L::kRowStride}, q_lo{rows_lo, L::kRowStride};
  float o_linear[L::kPasses][L::kTilesPerWarp][4];
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass) {
    __syncthreads(); // phi(Q_i) is written; the previous pass's reads of the slice are done
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v) {
      const int piece = v * kThreads + threadIdx.x, a = piece * 8 / D, c = piece * 8 % D - pass * L::kColumns;
      if (piece < L::kVectors && c >= 0 && c < L::kColumns)
        store_split8(state[v], factor, operand_hi + a * L::kStateStride + c, operand_lo + a * L::kStateStride + c);
    }
    __syncthreads();
    const SharedF16 h_hi{operand_hi, L::kStateStride}, h_lo{operand_lo, L::kStateStride};
#pragma unroll
    for (int t = 0; t < L::kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= L::kTiles)
        continue;
      const int m0 = (tile / (L::kColumns / 8)) * 16, n0 = (tile % (L::kColumns / 8)) * 8;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_tile_split<D, false, true>(acc, q_hi, q_lo, h_hi, h_lo, m0, n0); // H_i's slice is [in][out]
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + tile_row() + (e >= 2 ? 8 : 0), col = pass * L::kColumns + n0 + tile_col() + (e & 1);
        const float value = denominator[r] != 0.0f ? acc[e] / denominator[r] : 0.0f;
        o_linear[pass][t][e] = value;
        if (p.o_linear && begin + r < end)
          p.o_linear[((static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.tokens_q + begin + r) * D + col] =
              value;
      }
    }
  }
  if (!p.proj_weight)
    return; // O^s and O^l apart: the caller's Proj (a torch.nn.Linear) combines them

  // O = O^s + O^l W^T + b: O^l split into the rows' buffer, W's rows (out) kColumns per pass.
  __syncthreads(); // every read of phi(Q_i) and of H_i's slice is done
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass)
#pragma unroll
    for (int t = 0; t < L::kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= L::kTiles)
        continue;
      const int m0 = (tile / (L::kColumns / 8)) * 16, n0 = (tile % (L::kColumns / 8)) * 8;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + tile_row() + (e >= 2 ? 8 : 0), col = pass * L::kColumns + n0 + tile_col() + (e & 1);
        split_f16(o_linear[pass][t][e], rows_hi[r * L::kRowStride + col], rows_lo[r * L::kRowStride + col]);
      }
    }
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass) {
    if (pass > 0)
      __syncthreads(); // the previous pass's reads of W's rows are done
    for (int piece = threadIdx.x; piece < L::kColumns * D / 8; piece += kThreads) {
      const int out = piece * 8 / D, in = piece * 8 % D;
      float values[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        values[e] = p.proj_weight[(pass * L::kColumns + out) * D + in + e];
      store_split8(values, 1.0f, operand_hi + out * L::kRowStride + in, operand_lo + out * L::kRowStride + in);
    }
    __syncthreads();
    const SharedF16 w_hi{operand_hi, L::kRowStride}, w_lo{operand_lo, L::kRowStride};
#pragma unroll
    for (int t = 0; t < L::kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= L::kTiles)
        continue;
      const int m0 = (tile / (L::kColumns / 8)) * 16, n0 = (tile % (L::kColumns / 8)) * 8;
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      mma_tile_split<D, false, false>(acc, q_hi, q_lo, w_hi, w_lo, m0, n0); // W is [out][in]: B^T
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + tile_row() + (e >= 2 ? 8 : 0), out = pass * L::kColumns + n0 + tile_col() + (e & 1);
        if (begin + r >= end)
          continue;
        float value = acc[e] + (p.proj_bias ? p.proj_bias[out] : 0.0f);
        value += load_f16(p.o_sparse, element_index(p.o_sparse_strides, b, h, begin + r, out));
        store_f16(p.out, element_index(p.out_strides, b, h, begin + r, out), value);
      }
    }
  }
}

} // namespace sage::device::sla
