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

// f16x2 of two floats, `low` at the lower address, with one packed conversion (sm_80+): pack_f16x2(f16_bits(low),
// f16_bits(high)) bit for bit.
__device__ __forceinline__ unsigned pack_f16x2_rn(float low, float high) {
  unsigned bits;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
  return bits;
}

// split_f16 of two values with packed conversions (6 instructions per pair instead of 8, and no packing): the same
// hi and lo bits, as f16x2 words.
__device__ __forceinline__ void split_f16x2(float low, float high, unsigned &hi, unsigned &lo) {
  hi = pack_f16x2_rn(low, high);
  lo = pack_f16x2_rn(low - f16_value(static_cast<unsigned short>(hi & 0xffffu)),
                     high - f16_value(static_cast<unsigned short>(hi >> 16)));
}

// store_split8 with split_f16x2 (the same bits).
__device__ __forceinline__ void store_split8_packed(const float (&values)[8], float factor, unsigned short *hi,
                                                    unsigned short *lo) {
  unsigned h[4], l[4];
#pragma unroll
  for (int w = 0; w < 4; ++w)
    split_f16x2(values[2 * w] * factor, values[2 * w + 1] * factor, h[w], l[w]);
  *reinterpret_cast<uint4 *>(hi) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4 *>(lo) = make_uint4(l[0], l[1], l[2], l[3]);
}

// The power of two that brings max |x| (finite, > 0) into [2^14, 2^15): 2^-e for max = m 2^e, m in [0.5, 1).
__device__ __forceinline__ float f16_range_factor(float largest) {
  if (!(largest > 0.0f) || isinf(largest))
    return 1.0f;
  int exponent = 0;
  frexpf(largest, &exponent);
  return ldexpf(1.0f, 15 - exponent);
}

// ---- Vectorized I/O of the state and output kernels: rows of D f16 values (K, V, Q, O^s, O) and f32 vectors in
// 16-byte pieces of 8 values (f16) or 4 (f32). kLanes consecutive lanes of a warp hold one row, so a row's reductions
// are shuffles.

// Whether an f16 tensor's rows can be read 16 bytes at a time: a 16-byte-aligned base and strides of multiples of 8.
__device__ __forceinline__ bool rows_vectorizable(const void *base, const SageSlaStrides &strides) {
  return (reinterpret_cast<unsigned long long>(base) & 15u) == 0 &&
         ((strides.batch | strides.head | strides.token) & 7) == 0;
}

// 8 consecutive f16 values at `index`: one 16-byte load when `vector`, else 8 loads of 2 bytes. Plain loads (not
// __ldg): O^s may alias the output the same kernel writes.
__device__ __forceinline__ uint4 load_f16x8(const void *base, long long index, bool vector) {
  const unsigned short *at = static_cast<const unsigned short *>(base) + index;
  if (vector)
    return *reinterpret_cast<const uint4 *>(at);
  return make_uint4(pack_f16x2(at[0], at[1]), pack_f16x2(at[2], at[3]), pack_f16x2(at[4], at[5]),
                    pack_f16x2(at[6], at[7]));
}

__device__ __forceinline__ void store_f16x8(void *base, long long index, bool vector, uint4 bits) {
  unsigned short *at = static_cast<unsigned short *>(base) + index;
  if (vector) {
    *reinterpret_cast<uint4 *>(at) = bits;
    return;
  }
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    at[2 * w] = static_cast<unsigned short>(words[w] & 0xffffu);
    at[2 * w + 1] = static_cast<unsigned short>(words[w] >> 16);
  }
}

__device__ __forceinline__ void unpack_f16x8(uint4 bits, float (&x)[8]) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    x[2 * w] = f16_value(static_cast<unsigned short>(words[w] & 0xffffu));
    x[2 * w + 1] = f16_value(static_cast<unsigned short>(words[w] >> 16));
  }
}

__device__ __forceinline__ uint4 pack_f16x8(const float (&x)[8]) {
  return make_uint4(pack_f16x2_rn(x[0], x[1]), pack_f16x2_rn(x[2], x[3]), pack_f16x2_rn(x[4], x[5]),
                    pack_f16x2_rn(x[6], x[7]));
}

// 16 bytes global -> shared without registers (cp.async, sm_80+); `valid` false writes 16 zero bytes, reads nothing.
__device__ __forceinline__ void linear_copy16_async(void *shared, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void linear_commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void linear_wait_copies() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Sum and max over the kLanes consecutive lanes (a power of two <= 32) that hold one row.
template <int kLanes> __device__ __forceinline__ float lanes_sum(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
template <int kLanes> __device__ __forceinline__ float lanes_max(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// phi over a row held by kLanes lanes, 8 features each (softmax is over the row). Every lane of the warp calls it.
template <int kLanes, int kPhi> __device__ __forceinline__ void feature_map_x8(float (&x)[8]) {
  if (kPhi == kPhiSoftmax) {
    float top = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e)
      top = fmaxf(top, x[e]);
    top = lanes_max<kLanes>(top);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = expf(x[e] - top);
      sum += x[e];
    }
    const float inverse = 1.0f / lanes_sum<kLanes>(sum);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] *= inverse;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] = kPhi == kPhiEluPlusOne ? (x[e] > 0.0f ? x[e] + 1.0f : expf(x[e])) : fmaxf(x[e], 0.0f);
  }
}

// sum_listed_vectors with 16-byte loads: kGroups groups of D / 4 threads take every kGroups-th entry, four entries in
// flight per group (their list entries first, then the vectors). The sum's order is fixed (deterministic).
// `scratch`: SumListedX4<D>::kScratchFloats floats of shared memory, free on entry (and on return).
template <int D> struct SumListedX4 {
  static constexpr int kLanes = D / 4;
  static constexpr int kGroups = kThreads / kLanes < 8 ? kThreads / kLanes : 8;
  static constexpr int kScratchFloats = kGroups * D;
  static_assert(D % 4 == 0 && kThreads % kLanes == 0, "D / 4 divides the CTA");
};
template <int D>
__device__ float sum_listed_vectors_x4(const float *vectors, long long first, const int *list, int count,
                                       float *scratch) {
  constexpr int kLanes = SumListedX4<D>::kLanes, kGroups = SumListedX4<D>::kGroups;
  constexpr int kInFlight = 4;
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const float4 *base = reinterpret_cast<const float4 *>(vectors + first * D) + lane;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int n = group < kGroups ? group : count; n < count; n += kInFlight * kGroups) {
    int j[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      j[u] = n + u * kGroups < count ? list[n + u * kGroups] : -1;
    float4 value[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      value[u] = j[u] >= 0 ? __ldg(base + static_cast<long long>(j[u]) * kLanes) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      sum.x += value[u].x;
      sum.y += value[u].y;
      sum.z += value[u].z;
      sum.w += value[u].w;
    }
  }
  if (group < kGroups)
    reinterpret_cast<float4 *>(scratch)[threadIdx.x] = sum; // group g's columns at scratch[g * D ...]
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < D)
    for (int g = 0; g < kGroups; ++g)
      total += scratch[g * D + threadIdx.x];
  __syncthreads(); // scratch is free again
  return total;
}

// B operands of two adjacent 16 x 8 tiles (k0, n0) and (k0, n0 + 8) of a k-major matrix ([k][n]) in one ldmatrix:
// b[0], b[1] for n0, b[2], b[3] for n0 + 8.
__device__ __forceinline__ void load_b_pair_k_major(unsigned (&b)[4], SharedF16 s, int k0, int n0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, row = lane % 8;
  ldmatrix_x4<true>(b, shared_address(s.base + (k0 + (matrix & 1) * 8 + row) * s.stride + n0 + (matrix >> 1) * 8));
}

// The state kernel's warp tiles of h_j (D x D): warp w owns row tile w % kRowTiles (16 features of phi(K)) and
// kColumnTiles consecutive 8-column tiles of V from column tile (w / kRowTiles) kColumnTiles; so phi(K)'s fragments
// load once per k-step for all of a warp's tiles.
template <int D> struct StateWarpTiles {
  static constexpr int kRowTiles = D / 16;
  static constexpr int kWarpsPerRow = kWarps / kRowTiles;
  static constexpr int kColumnTiles = D / 8 / kWarpsPerRow > 0 ? D / 8 / kWarpsPerRow : 1;
  static_assert(kRowTiles <= kWarps && kWarps % kRowTiles == 0, "D must be 16, 32, 64 or 128");
  __device__ static int m0() { return (threadIdx.x / 32) % kRowTiles * 16; }
  __device__ static int first_column() { return (threadIdx.x / 32) / kRowTiles * kColumnTiles * 8; }
  __device__ static bool active() { return first_column() < D; } // D = 16: 2 of the 8 warps
};

// Launch 3: h_j = phi(K_j)^T V_j, z_j = colsum(phi(K_j)) for one kv block of one kv head, kStateChunk tokens at a
// time: every thread copies its pieces of the chunk's K and V rows (16 bytes each, D / 8 lanes per row) into shared
// memory asynchronously; the next chunk's copies go out before this chunk's products (their latency overlaps them).
// phi(K) is split in f16 hi + lo, V is f16; f32 accumulators in registers (StateWarpTiles).
template <int D, int BLOCK_KV, int PHI> __device__ void linear_states(const SageSlaStateParams &p) {
  static_assert(D % 16 == 0 && D <= 128, "the tensor-core tiles take D in steps of 16, up to 128");
  using Tiles = StateWarpTiles<D>;
  constexpr int kStride = D + 8, kLanes = D / 8;
  constexpr int kPieces = kStateChunk * kLanes, kLoads = (kPieces + kThreads - 1) / kThreads;
  constexpr int kChunks = (BLOCK_KV + kStateChunk - 1) / kStateChunk;
  static_assert(kPieces % 32 == 0 && kThreads % kLanes == 0, "a warp holds whole rows; a thread keeps its columns");
  __shared__ __align__(16) unsigned short k_hi[kStateChunk * kStride], k_lo[kStateChunk * kStride];
  __shared__ __align__(16) unsigned short k_rows[kStateChunk * kStride];    // K as loaded (each thread its own pieces)
  __shared__ __align__(16) unsigned short v_rows[2][kStateChunk * kStride]; // double-buffered: copied asynchronously
  __shared__ float z_partial[kWarps][D / 8 * 9]; // lane l's 8 columns at 9 l: no bank conflicts
  __shared__ float scratch[kWarps];
  const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int begin = j * BLOCK_KV, end = min(p.shape.tokens_kv, begin + BLOCK_KV);
  const bool k_vector = rows_vectorizable(p.k, p.k_strides), v_vector = rows_vectorizable(p.v, p.v_strides);
  const int column = threadIdx.x % kLanes * 8; // the same for all of a thread's pieces
  // A thread's pieces of a chunk's K rows into k_rows (it alone reads them back: no barrier), V's into v_rows[buffer];
  // asynchronous 16-byte copies, plain loads where a tensor is not aligned; zeros past the block's end.
  auto copy_rows = [&](unsigned short *to, const void *base, const SageSlaStrides &strides, bool vector, int t) {
    const bool valid = t < end;
    const long long from = valid ? element_index(strides, b, h, t, column) : 0;
    if (vector)
      linear_copy16_async(to, static_cast<const unsigned short *>(base) + from, valid);
    else
      *reinterpret_cast<uint4 *>(to) = valid ? load_f16x8(base, from, false) : make_uint4(0u, 0u, 0u, 0u);
  };
  auto load_chunk = [&](int chunk, int buffer) {
#pragma unroll
    for (int m = 0; m < kLoads; ++m) {
      const int piece = m * kThreads + threadIdx.x, r = piece / kLanes;
      if (piece >= kPieces)
        continue;
      copy_rows(k_rows + r * kStride + column, p.k, p.k_strides, k_vector, chunk + r);
      copy_rows(v_rows[buffer] + r * kStride + column, p.v, p.v_strides, v_vector, chunk + r);
    }
    linear_commit_copies();
  };
  float acc[Tiles::kColumnTiles][4];
#pragma unroll
  for (int t = 0; t < Tiles::kColumnTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[t][e] = 0.0f;
  if (lane < kLanes) // z_j's sums per warp: only these lanes touch their warp's entries (no barrier)
#pragma unroll
    for (int e = 0; e < 8; ++e)
      z_partial[warp][lane * 9 + e] = 0.0f;
  const SharedF16 a_hi{k_hi, kStride}, a_lo{k_lo, kStride};
  load_chunk(begin, 0);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int chunk = begin + c * kStateChunk;
    if (c > 0)
      __syncthreads();    // the previous chunk's products are done
    linear_wait_copies(); // this chunk's K and V (the barrier below publishes V)
#pragma unroll
    for (int m = 0; m < kLoads; ++m) {
      const int piece = m * kThreads + threadIdx.x, r = piece / kLanes;
      if (piece >= kPieces) // the same for the whole warp
        continue;
      const bool valid = chunk + r < end; // rows past the block's end stay 0 in phi(K) and V (phi(0) is not 0)
      float x[8], z[8];
      unpack_f16x8(*reinterpret_cast<const uint4 *>(k_rows + r * kStride + column), x);
      feature_map_x8<kLanes, PHI>(x);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        x[e] = valid ? x[e] : 0.0f;
        z[e] = x[e];
#pragma unroll
        for (int offset = kLanes; offset < 32; offset <<= 1) // the warp's rows, in a fixed order (deterministic)
          z[e] += __shfl_xor_sync(0xffffffffu, z[e], offset);
      }
      if (lane < kLanes)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          z_partial[warp][lane * 9 + e] += z[e];
      store_split8_packed(x, 1.0f, k_hi + r * kStride + column, k_lo + r * kStride + column);
    }
    if (c + 1 < kChunks)
      load_chunk(begin + (c + 1) * kStateChunk, (c + 1) % 2); // that buffer's last reader was chunk c - 1
    __syncthreads();
    const SharedF16 b_v{v_rows[c % 2], kStride};
    if (Tiles::active()) {
      const int m0 = Tiles::m0(), n0 = Tiles::first_column();
#pragma unroll
      for (int k0 = 0; k0 < kStateChunk; k0 += 16) {
        unsigned ah[4], al[4];
        load_a<true>(ah, a_hi, m0, k0); // A = phi(K)^T, stored [token][feature]
        load_a<true>(al, a_lo, m0, k0);
        if constexpr (Tiles::kColumnTiles % 2 == 0) {
#pragma unroll
          for (int t = 0; t < Tiles::kColumnTiles; t += 2) {
            unsigned bv[4];
            load_b_pair_k_major(bv, b_v, k0, n0 + 8 * t);
            const unsigned first[2] = {bv[0], bv[1]}, second[2] = {bv[2], bv[3]};
            mma_f16(acc[t], al, first);
            mma_f16(acc[t], ah, first);
            mma_f16(acc[t + 1], al, second);
            mma_f16(acc[t + 1], ah, second);
          }
        } else {
#pragma unroll
          for (int t = 0; t < Tiles::kColumnTiles; ++t) {
            unsigned bv[2];
            load_b<true>(bv, b_v, k0, n0 + 8 * t);
            mma_f16(acc[t], al, bv);
            mma_f16(acc[t], ah, bv);
          }
        }
      }
    }
  }

  // z_j in a fixed order (the warps' sums in warp order), the scale s_j, then h_j / s_j in f16.
  float largest = 0.0f;
#pragma unroll
  for (int t = 0; t < Tiles::kColumnTiles; ++t)
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
      sum += z_partial[w][threadIdx.x / 8 * 9 + threadIdx.x % 8]; // column c at 9 (c / 8) + c % 8
    p.z_states[state * D + threadIdx.x] = sum;
  }
  if (threadIdx.x == 0)
    p.h_scales[state] = 1.0f / factor; // exact: a power of two
  if (!Tiles::active())
    return;
  unsigned *out = reinterpret_cast<unsigned *>(p.h_states + state * D * D);
#pragma unroll
  for (int t = 0; t < Tiles::kColumnTiles; ++t) {
    const int row = Tiles::m0() + tile_row(), col = Tiles::first_column() + 8 * t + tile_col();
    out[(row * D + col) / 2] = pack_f16x2_rn(acc[t][0] * factor, acc[t][1] * factor);
    out[((row + 8) * D + col) / 2] = pack_f16x2_rn(acc[t][2] * factor, acc[t][3] * factor);
  }
}

// Launch 3b: sum_j z_j in f32 (Z_i with pre-aggregation: the total minus the listed z_j), in a fixed order
// (deterministic): kThreads / D groups of D threads sum every group-th block, eight loads in flight each, then the
// groups' sums in group order.
template <int D> __device__ void linear_totals(const SageSlaTotalsParams &p) {
  constexpr int kGroups = kThreads / D;
  static_assert(kThreads % D == 0, "D divides the CTA");
  __shared__ float partial[kGroups][D];
  const long long head = static_cast<long long>(blockIdx.z) * p.shape.heads_kv + blockIdx.y;
  const int column = threadIdx.x % D, group = threadIdx.x / D, blocks = p.shape.kv_blocks;
  const float *z = p.z_states + head * blocks * D + column;
  float sum = 0.0f;
  int j = group;
  for (; j + 7 * kGroups < blocks; j += 8 * kGroups) {
    float value[8];
#pragma unroll
    for (int u = 0; u < 8; ++u)
      value[u] = __ldg(z + static_cast<long long>(j + u * kGroups) * D);
#pragma unroll
    for (int u = 0; u < 8; ++u)
      sum += value[u];
  }
  for (; j < blocks; j += kGroups)
    sum += __ldg(z + static_cast<long long>(j) * D);
  partial[group][column] = sum;
  __syncthreads();
  if (threadIdx.x < D) {
    float total = 0.0f;
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
      total += partial[g][threadIdx.x];
    p.z_total[head * D + threadIdx.x] = total;
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

// The output kernel's products: a warp's kTilesPerWarp 16 x 8 tiles (tile = warp + kWarps t of kTiles, kTileColumns
// tiles per row) of A B, A = rows in shared memory ([m][k]), both operands split in hi and lo (three products). When
// a row of tiles is kWarps wide, a warp's tiles share one column (m0 = 16 t, n0 = 8 warp): B's fragments are loaded
// once per k-step for all of them (10 ldmatrix per 12 mma instead of 16).
template <int K, bool kBKMajor, int kTiles, int kTilesPerWarp, int kTileColumns>
__device__ __forceinline__ void output_tiles_split(float (&c)[kTilesPerWarp][4], SharedF16 a_hi, SharedF16 a_lo,
                                                   SharedF16 b_hi, SharedF16 b_lo) {
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      c[t][e] = 0.0f;
  if constexpr (kTileColumns == kWarps && kTiles == kWarps * kTilesPerWarp) {
    const int n0 = 8 * warp;
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += 16) {
      unsigned bh[2], bl[2];
      load_b<kBKMajor>(bh, b_hi, k0, n0);
      load_b<kBKMajor>(bl, b_lo, k0, n0);
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        unsigned ah[4], al[4];
        load_a<false>(ah, a_hi, 16 * t, k0);
        load_a<false>(al, a_lo, 16 * t, k0);
        mma_f16(c[t], al, bh);
        mma_f16(c[t], ah, bl);
        mma_f16(c[t], ah, bh);
      }
    }
  } else {
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile < kTiles)
        mma_tile_split<K, false, kBKMajor>(c[t], a_hi, a_lo, b_hi, b_lo, (tile / kTileColumns) * 16,
                                           (tile % kTileColumns) * 8);
    }
  }
}

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
  constexpr int kLanes = D / 8; // lanes per row of Q, O^s and O (16-byte pieces of 8 f16 values)
  constexpr int kRowPieces = L::kRows * kLanes, kRowLoads = (kRowPieces + kThreads - 1) / kThreads;
  constexpr int kRowBatch = 4;        // pieces of rows in flight per thread
  constexpr int kStageStride = D + 8; // f32 O^l W^T + b over the rows' buffers (kRows x (D + 8) floats)
  static_assert(kRowPieces % 32 == 0, "a warp holds whole rows");
  static_assert(4 * SumListedX4<D>::kScratchFloats <= 2 * 2 * L::kOperandHalves, "the z sum's scratch fits");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *operand_hi = reinterpret_cast<unsigned short *>(shared_bytes); // H_i's slice, then W's rows
  unsigned short *operand_lo = operand_hi + L::kOperandHalves;
  unsigned short *rows_hi = operand_lo + L::kOperandHalves; // phi(Q_i), then O^l
  unsigned short *rows_lo = rows_hi + L::kRowHalves;
  float *z_state = reinterpret_cast<float *>(rows_lo + L::kRowHalves);
  float *denominator = z_state + D;
  float *scratch = denominator + L::kRows;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x, warp = threadIdx.x / 32;
  const int h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  const long long row = (static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.q_blocks + i;
  const int begin = i * BLOCK_Q, end = min(p.shape.tokens_q, begin + BLOCK_Q);
  const bool q_vector = rows_vectorizable(p.q, p.q_strides);

  // Q_i's rows, fetched first into the rows' lo buffer (f16, kRowStride per row) so that their latency overlaps H_i's
  // and Z_i's: 16-byte asynchronous copies (zeros past the block's end), or plain loads where Q is not aligned. Each
  // thread later reads back only its own pieces (no barrier).
#pragma unroll
  for (int m = 0; m < kRowLoads; ++m) {
    const int piece = m * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
    if (piece >= kRowPieces)
      continue;
    unsigned short *to = rows_lo + r * L::kRowStride + c;
    const bool valid = begin + r < end;
    const long long from = valid ? element_index(p.q_strides, b, h, begin + r, c) : 0;
    if (q_vector)
      linear_copy16_async(to, static_cast<const unsigned short *>(p.q) + from, valid);
    else
      *reinterpret_cast<uint4 *>(to) = valid ? load_f16x8(p.q, from, false) : make_uint4(0u, 0u, 0u, 0u);
  }
  linear_commit_copies();

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
  // Scratch: the operands' buffers, free until the first pass.
  const float z_listed = sum_listed_vectors_x4<D>(p.z_states, head_kv * p.shape.kv_blocks, lut, listed,
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
          words[w] = pack_f16x2_rn(state[v][2 * w] * factor, state[v][2 * w + 1] * factor);
        reinterpret_cast<uint4 *>(p.h_rows)[row * L::kVectors + v * kThreads + threadIdx.x] =
            make_uint4(words[0], words[1], words[2], words[3]);
      }
    if (threadIdx.x == 0)
      p.h_row_scales[row] = 1.0f / factor;
    if (threadIdx.x < D)
      p.z_rows[row * D + threadIdx.x] = z;
  }

  // Line 16's rows: phi(q_r) split into f16 hi + lo, and the denominator phi(q_r) Z_i in f32 (scaled as H_i is). A row
  // is kLanes consecutive lanes with 8 features each; a thread's pieces are those it fetched above.
  linear_wait_copies();
#pragma unroll 1 // one piece at a time: H_i's registers are live meanwhile
  for (int m = 0; m < kRowLoads; ++m) {
    const int piece = m * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
    if (piece >= kRowPieces) // the same for the whole warp (whole rows per warp)
      continue;
    const bool valid = begin + r < end;
    float x[8];
    unpack_f16x8(*reinterpret_cast<const uint4 *>(rows_lo + r * L::kRowStride + c), x);
    feature_map_x8<kLanes, PHI>(x);
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = valid ? x[e] : 0.0f; // rows past the block's end stay 0 (phi(0) is not 0)
      dot += x[e] * z_state[c + e];
    }
    dot = lanes_sum<kLanes>(dot);
    if (c == 0) // its reciprocal: one multiply per element of O^l instead of a division
      denominator[r] = valid && dot * factor != 0.0f ? 1.0f / (dot * factor) : 0.0f;
    store_split8_packed(x, 1.0f, rows_hi + r * L::kRowStride + c, rows_lo + r * L::kRowStride + c);
  }

  // phi(Q_i) H_i, kColumns output columns per pass; O^l stays in registers for Proj.
  const SharedF16 q_hi{rows_hi, L::kRowStride}, q_lo{rows_lo, L::kRowStride};
  const bool o_linear_pairs = (reinterpret_cast<unsigned long long>(p.o_linear) & 7u) == 0;
  float o_linear[L::kPasses][L::kTilesPerWarp][4];
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass) {
    __syncthreads(); // phi(Q_i) is written; the previous pass's reads of the slice are done
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v) {
      const int piece = v * kThreads + threadIdx.x, a = piece * 8 / D, c = piece * 8 % D - pass * L::kColumns;
      if (piece < L::kVectors && c >= 0 && c < L::kColumns)
        store_split8_packed(state[v], factor, operand_hi + a * L::kStateStride + c,
                            operand_lo + a * L::kStateStride + c);
    }
    __syncthreads();
    const SharedF16 h_hi{operand_hi, L::kStateStride}, h_lo{operand_lo, L::kStateStride};
    float acc[L::kTilesPerWarp][4];
    output_tiles_split<D, true, L::kTiles, L::kTilesPerWarp, L::kColumns / 8>(acc, q_hi, q_lo, h_hi,
                                                                              h_lo); // H_i's slice is [in][out]
#pragma unroll
    for (int t = 0; t < L::kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= L::kTiles)
        continue;
      const int m0 = (tile / (L::kColumns / 8)) * 16, n0 = (tile % (L::kColumns / 8)) * 8;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + tile_row() + (e >= 2 ? 8 : 0);
        o_linear[pass][t][e] = acc[t][e] * denominator[r]; // the reciprocal (0 where the denominator is)
      }
      if (!p.o_linear)
        continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) { // two adjacent columns per store (8-byte aligned: col is even)
        const int r = m0 + tile_row() + 8 * half, col = pass * L::kColumns + n0 + tile_col();
        float *to =
            p.o_linear + ((static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.tokens_q + begin + r) * D + col;
        if (begin + r >= end)
          continue;
        if (o_linear_pairs)
          *reinterpret_cast<float2 *>(to) = make_float2(o_linear[pass][t][2 * half], o_linear[pass][t][2 * half + 1]);
        else
          to[0] = o_linear[pass][t][2 * half], to[1] = o_linear[pass][t][2 * half + 1];
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
      for (int half = 0; half < 2; ++half) { // two adjacent columns per 4-byte store (col is even)
        const int r = m0 + tile_row() + 8 * half, col = pass * L::kColumns + n0 + tile_col();
        unsigned hi, lo;
        split_f16x2(o_linear[pass][t][2 * half], o_linear[pass][t][2 * half + 1], hi, lo);
        *reinterpret_cast<unsigned *>(rows_hi + r * L::kRowStride + col) = hi;
        *reinterpret_cast<unsigned *>(rows_lo + r * L::kRowStride + col) = lo;
      }
    }
  // W's rows are read coalesced, 16 bytes at a time when W is 16-byte aligned, all of a pass's loads before the
  // barrier that frees the operand buffer (the loads' latency overlaps the wait).
  constexpr int kWeightPieces = L::kColumns * D / 8, kWeightLoads = (kWeightPieces + kThreads - 1) / kThreads;
  constexpr int kWeightBatch = L::kTilesPerWarp > 4 ? 2 : 4; // pieces in flight: fewer where O's tiles take registers
  const bool weight_vector = (reinterpret_cast<unsigned long long>(p.proj_weight) & 15u) == 0;
  float o_final[L::kPasses][L::kTilesPerWarp][4];
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass) {
#pragma unroll
    for (int m0 = 0; m0 < kWeightLoads; m0 += kWeightBatch) {
      float weights[kWeightBatch][8];
#pragma unroll
      for (int u = 0; u < kWeightBatch; ++u) {
        const int piece = (m0 + u) * kThreads + threadIdx.x;
        if (m0 + u >= kWeightLoads || piece >= kWeightPieces)
          continue;
        const float *from = p.proj_weight + (pass * L::kColumns + piece * 8 / D) * D + piece * 8 % D;
        if (weight_vector) {
          const float4 left = __ldg(reinterpret_cast<const float4 *>(from));
          const float4 right = __ldg(reinterpret_cast<const float4 *>(from) + 1);
          weights[u][0] = left.x, weights[u][1] = left.y, weights[u][2] = left.z, weights[u][3] = left.w;
          weights[u][4] = right.x, weights[u][5] = right.y, weights[u][6] = right.z, weights[u][7] = right.w;
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            weights[u][e] = __ldg(from + e);
        }
      }
      if (pass > 0 && m0 == 0)
        __syncthreads(); // the previous pass's reads of W's rows are done
#pragma unroll
      for (int u = 0; u < kWeightBatch; ++u) {
        const int piece = (m0 + u) * kThreads + threadIdx.x, out = piece * 8 / D, in = piece * 8 % D;
        if (m0 + u < kWeightLoads && piece < kWeightPieces)
          store_split8_packed(weights[u], 1.0f, operand_hi + out * L::kRowStride + in,
                              operand_lo + out * L::kRowStride + in);
      }
    }
    __syncthreads();
    const SharedF16 w_hi{operand_hi, L::kRowStride}, w_lo{operand_lo, L::kRowStride};
    output_tiles_split<D, false, L::kTiles, L::kTilesPerWarp, L::kColumns / 8>(o_final[pass], q_hi, q_lo, w_hi,
                                                                               w_lo); // W is [out][in]: B^T
  }

  // O^l W^T + b staged in f32 over the rows' buffers, then O = O^s + that row by row, 16 bytes at a time: every
  // thread reads its pieces of O^s before it writes O (O may alias O^s; a piece is read and written by one thread).
  __syncthreads(); // every read of O^l's rows is done
  float *staged = reinterpret_cast<float *>(rows_hi);
#pragma unroll
  for (int pass = 0; pass < L::kPasses; ++pass)
#pragma unroll
    for (int t = 0; t < L::kTilesPerWarp; ++t) {
      const int tile = warp + kWarps * t;
      if (tile >= L::kTiles)
        continue;
      const int m0 = (tile / (L::kColumns / 8)) * 16, n0 = (tile % (L::kColumns / 8)) * 8;
      const int out = pass * L::kColumns + n0 + tile_col();
      const float bias0 = p.proj_bias ? p.proj_bias[out] : 0.0f, bias1 = p.proj_bias ? p.proj_bias[out + 1] : 0.0f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = m0 + tile_row() + 8 * half;
        *reinterpret_cast<float2 *>(staged + r * kStageStride + out) =
            make_float2(o_final[pass][t][2 * half] + bias0, o_final[pass][t][2 * half + 1] + bias1);
      }
    }
  __syncthreads();
  const bool o_vector = rows_vectorizable(p.o_sparse, p.o_sparse_strides) && rows_vectorizable(p.out, p.out_strides);
#pragma unroll
  for (int m0 = 0; m0 < kRowLoads; m0 += kRowBatch) {
    uint4 bits[kRowBatch];
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      const int piece = (m0 + u) * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
      bits[u] = make_uint4(0u, 0u, 0u, 0u);
      if (m0 + u < kRowLoads && piece < kRowPieces && begin + r < end)
        bits[u] = load_f16x8(p.o_sparse, element_index(p.o_sparse_strides, b, h, begin + r, c), o_vector);
    }
#pragma unroll
    for (int u = 0; u < kRowBatch; ++u) {
      const int piece = (m0 + u) * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
      if (m0 + u >= kRowLoads || piece >= kRowPieces || begin + r >= end)
        continue;
      float x[8];
      unpack_f16x8(bits[u], x);
      const float4 left = *reinterpret_cast<const float4 *>(staged + r * kStageStride + c);
      const float4 right = *reinterpret_cast<const float4 *>(staged + r * kStageStride + c + 4);
      x[0] += left.x, x[1] += left.y, x[2] += left.z, x[3] += left.w;
      x[4] += right.x, x[5] += right.y, x[6] += right.z, x[7] += right.w;
      store_f16x8(p.out, element_index(p.out_strides, b, h, begin + r, c), o_vector, pack_f16x8(x));
    }
  }
}

} // namespace sage::device::sla
