// SLA's linear branch, Algorithm 1 line 4: h_j = phi(K_j)^T V_j and z_j = colsum(phi(K_j)) per kv block (launch 3)
// on tensor cores with split f16 operands (tensor_core.cuh), stored in f16 with a power-of-two scale per block, and
// their totals over the kv blocks (launch 3b, for pre-aggregation).
#pragma once

#include "sage/device/sla/linear_support.cuh"

namespace sage::device::sla {

constexpr int kStateChunk = 32; // tokens of K/V staged at a time by the state kernel (a multiple of 16)

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
// phi(K) is split in f16 hi + lo, V is f16; f32 accumulators in registers (StateWarpTiles). kBf16: K and V are bf16,
// phi(K) is split in bf16 hi + lo and the products run on bf16 operands (V exact whatever its magnitude:
// tensor_core.cuh); h_j / s_j is stored in f16 as in an f16 module.
template <int D, int BLOCK_KV, int PHI, bool kBf16> __device__ void linear_states(const SageSlaStateParams &p) {
  static_assert(D % 16 == 0 && D <= 128, "the tensor-core tiles take D in steps of 16, up to 128");
  using Tiles = StateWarpTiles<D>;
  constexpr int kStride = D + 8, kLanes = D / 8;
  constexpr int kPieces = kStateChunk * kLanes, kLoads = (kPieces + kThreads - 1) / kThreads;
  constexpr int kChunks = (BLOCK_KV + kStateChunk - 1) / kStateChunk;
  static_assert(kPieces % 32 == 0 && kThreads % kLanes == 0, "a warp holds whole rows; a thread keeps its columns");
  // One buffer for the chunks' tiles, which h_j's f16 rows (kStride apart) take over at the end, so that they are
  // stored 16 bytes per thread and coalesced instead of as the tiles' scattered 4-byte pairs.
  constexpr int kTileHalves = kStateChunk * kStride;
  static_assert(D * kStride <= 5 * kTileHalves, "h_j's staged rows fit the chunks' tiles");
  __shared__ __align__(16) unsigned short tiles[5 * kTileHalves];
  unsigned short *const k_hi = tiles, *const k_lo = tiles + kTileHalves;
  unsigned short *const k_rows = tiles + 2 * kTileHalves; // K as loaded (each thread its own pieces)
  unsigned short *const v_rows[2] = {tiles + 3 * kTileHalves, tiles + 4 * kTileHalves}; // copied asynchronously
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
      copy16_async(to, static_cast<const unsigned short *>(base) + from, valid);
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
    commit_copies();
  };
  float acc[Tiles::kColumnTiles][4];
  clear_tiles(acc);
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
      __syncthreads(); // the previous chunk's products are done
    wait_all_copies(); // this chunk's K and V (the barrier below publishes V)
#pragma unroll
    for (int m = 0; m < kLoads; ++m) {
      const int piece = m * kThreads + threadIdx.x, r = piece / kLanes;
      if (piece >= kPieces) // the same for the whole warp
        continue;
      const bool valid = chunk + r < end; // rows past the block's end stay 0 in phi(K) and V (phi(0) is not 0)
      float x[8], z[8];
      unpack_x8<kBf16>(*reinterpret_cast<const uint4 *>(k_rows + r * kStride + column), x);
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
      store_split8_packed<kBf16>(x, 1.0f, k_hi + r * kStride + column, k_lo + r * kStride + column);
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
            mma_16bit<kBf16>(acc[t], al, first);
            mma_16bit<kBf16>(acc[t], ah, first);
            mma_16bit<kBf16>(acc[t + 1], al, second);
            mma_16bit<kBf16>(acc[t + 1], ah, second);
          }
        } else {
#pragma unroll
          for (int t = 0; t < Tiles::kColumnTiles; ++t) {
            unsigned bv[2];
            load_b<true>(bv, b_v, k0, n0 + 8 * t);
            mma_16bit<kBf16>(acc[t], al, bv);
            mma_16bit<kBf16>(acc[t], ah, bv);
          }
        }
      }
    }
  }

  // z_j in a fixed order (the warps' sums in warp order), the scale s_j, then h_j / s_j in f16.
  const float largest = block_reduce<true>(largest_magnitude(acc), scratch); // its barriers also publish z_partial
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
  // Every warp's products are done (block_reduce's first barrier): h_j / s_j in f16 into the staged rows, then out in
  // 16-byte pieces, D / 8 threads per row.
  if (Tiles::active())
#pragma unroll
    for (int t = 0; t < Tiles::kColumnTiles; ++t) {
      const int row = Tiles::m0() + tile_row(), col = Tiles::first_column() + 8 * t + tile_col();
      *reinterpret_cast<unsigned *>(tiles + row * kStride + col) =
          pack_f16x2_rn(acc[t][0] * factor, acc[t][1] * factor);
      *reinterpret_cast<unsigned *>(tiles + (row + 8) * kStride + col) =
          pack_f16x2_rn(acc[t][2] * factor, acc[t][3] * factor);
    }
  __syncthreads();
  uint4 *out = reinterpret_cast<uint4 *>(p.h_states + state * D * D);
  constexpr int kOutPieces = D * D / 8;
#pragma unroll
  for (int m = 0; m < (kOutPieces + kThreads - 1) / kThreads; ++m) {
    const int piece = m * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
    if (piece < kOutPieces)
      out[piece] = *reinterpret_cast<const uint4 *>(tiles + r * kStride + c);
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

} // namespace sage::device::sla
