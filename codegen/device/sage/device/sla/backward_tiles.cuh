// The tile machinery of SLA's linear-branch backward kernels (backward.cuh): which warp owns which 16 x 8 tiles of a
// chunk's rows x D outputs and of the D x D state, the warp-tile products on tensor cores (f32 operands split in f16
// hi + lo), and the row reductions, feature-map derivatives and stores over a chunk of SAGE_SLA_BACKWARD_CHUNK rows.
// The CTAs per SM of those kernels are decided here too, since the register budget of the products depends on it.
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

constexpr int kBackwardChunk = SAGE_SLA_BACKWARD_CHUNK; // rows (tokens) of a block staged at a time
constexpr int kWarpRows = kBackwardChunk / kWarps;      // rows of a chunk per warp where rows are staged
static_assert(kBackwardChunk == 32, "the chunk's outputs are two 16-row tiles (BackwardTiles)");

// The kv and rows kernels run two CTAs per SM where shared memory holds two (sm_90, sm_100: 227 KiB; 96,800 and
// 71,968 bytes each at d = 128; 128 registers, no spills under NVRTC), one elsewhere (sm_89, sm_120: ~100 KiB; sm_80
// would spill at 128 registers). While one CTA waits for its rows from memory, the other's products keep the tensor
// cores busy. The rows kernel ran one at 240 registers before (12.5% occupancy): at two it loads a chunk's raw rows
// when the chunk starts instead of one chunk ahead (the other CTA's products cover their latency), unrolls its
// products' k-steps partly and stores dQ 8 bytes per lane, so that dH_i's 64 accumulators per thread fit; at one, the
// next chunk's loads are in flight during the products.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200
constexpr int kBackwardMinBlocks = 2;
#else
constexpr int kBackwardMinBlocks = 1;
#endif
constexpr int kKvBackwardMinBlocks = kBackwardMinBlocks;
constexpr int kRowsBackwardMinBlocks = kBackwardMinBlocks;

// The warps' tiles (16 x 8 each) of the two output shapes. A chunk's rows x D (N, G, d phi(K), dV): 2 warps along the
// rows, up to 4 along the columns, kChunkN column tiles each. The D x D state dH_i (reduced over a chunk's rows): up
// to 4 warps along its rows (kStateM row tiles each) and the rest along its columns (kStateN column tiles each).
template <int D> struct BackwardTiles {
  static_assert(D % 16 == 0 && D <= 128, "D must be 16, 32, 64 or 128");
  static constexpr int kChunkWarpsM = kBackwardChunk / 16;
  static constexpr int kChunkWarpsN = D / 8 < kWarps / kChunkWarpsM ? D / 8 : kWarps / kChunkWarpsM;
  static constexpr int kChunkN = D / 8 / kChunkWarpsN;
  static constexpr int kStateWarpsM = D / 16 < 4 ? D / 16 : 4;
  static constexpr int kStateM = D / 16 / kStateWarpsM;
  static constexpr int kStateWarpsN = D / 8 < kWarps / kStateWarpsM ? D / 8 : kWarps / kStateWarpsM;
  static constexpr int kStateN = D / 8 / kStateWarpsN;
  static constexpr int kStride = D + 8; // halves per row of every f16 operand: ldmatrix without bank conflicts
  __device__ static bool chunk_warp() { return static_cast<int>(threadIdx.x) / 32 < kChunkWarpsM * kChunkWarpsN; }
  __device__ static int chunk_m0() { return (static_cast<int>(threadIdx.x) / 32 % kChunkWarpsM) * 16; }
  __device__ static int chunk_column_warp() { return static_cast<int>(threadIdx.x) / 32 / kChunkWarpsM; }
  __device__ static int chunk_n0() { return chunk_column_warp() * kChunkN * 8; }
  __device__ static bool state_warp() { return static_cast<int>(threadIdx.x) / 32 < kStateWarpsM * kStateWarpsN; }
  __device__ static int state_m0() { return (static_cast<int>(threadIdx.x) / 32 % kStateWarpsM) * kStateM * 16; }
  __device__ static int state_n0() { return (static_cast<int>(threadIdx.x) / 32 / kStateWarpsM) * kStateN * 8; }
};

// c += A B for a warp's MW x NW tiles of 16 x 8 at (m0, n0), over K (a multiple of 16). kSplitA / kSplitB: that
// operand is split in hi + lo (three products when both are, the lo x lo term dropped); otherwise its hi part is the
// exact f16 matrix. A's fragments are loaded once per k-step for all NW tiles, B's once for all MW. kUnroll: k-steps
// unrolled (all by default; fewer bound the fragments the compiler loads ahead, i.e. the registers). kBf16: bf16
// operands (the kv kernel of a bf16 module).
template <int K, int MW, int NW, bool kAKMajor, bool kBKMajor, bool kSplitA, bool kSplitB, int kUnroll = K / 16,
          bool kBf16 = false>
__device__ __forceinline__ void warp_tiles_mma(float (&c)[MW][NW][4], SharedF16 a_hi, SharedF16 a_lo, SharedF16 b_hi,
                                               SharedF16 b_lo, int m0, int n0) {
  static_assert(K % 16 == 0, "the reduction runs in steps of 16");
#pragma unroll(kUnroll)
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned ah[MW][4], al[MW][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
      load_a<kAKMajor>(ah[mi], a_hi, m0 + 16 * mi, k0);
      if (kSplitA)
        load_a<kAKMajor>(al[mi], a_lo, m0 + 16 * mi, k0);
    }
#pragma unroll
    for (int ni = 0; ni < NW; ++ni) {
      unsigned bh[2], bl[2];
      load_b<kBKMajor>(bh, b_hi, k0, n0 + 8 * ni);
      if (kSplitB)
        load_b<kBKMajor>(bl, b_lo, k0, n0 + 8 * ni);
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        if (kSplitA)
          mma_16bit<kBf16>(c[mi][ni], al[mi], bh);
        if (kSplitB)
          mma_16bit<kBf16>(c[mi][ni], ah[mi], bl);
        mma_16bit<kBf16>(c[mi][ni], ah[mi], bh);
      }
    }
  }
}

// An f32 value split in shared memory: hi + lo (~2^-22 relative; kBf16: bf16 parts, ~2^-16).
template <bool kBf16 = false>
__device__ __forceinline__ float split_value(const unsigned short *hi, const unsigned short *lo, int at) {
  return element_value<kBf16>(hi[at]) + element_value<kBf16>(lo[at]);
}

// A chunk tile's accumulator e: its row within the chunk and its column.
__device__ __forceinline__ int chunk_row(int m0, int e) { return m0 + tile_row() + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int chunk_column(int n0, int ni, int e) { return n0 + 8 * ni + tile_col() + (e & 1); }

// Per-row sums of a warp's chunk tiles (the two rows a lane holds), over the warp's columns, written to
// partial[column warp][row] for the CTA to add up after a barrier.
template <int N>
__device__ __forceinline__ void chunk_row_partials(const float (&values)[N][4], int m0, int column_warp,
                                                   float *partial) {
  float sums[2] = {0.0f, 0.0f};
#pragma unroll
  for (int ni = 0; ni < N; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      sums[e >> 1] += values[ni][e];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    sums[half] += __shfl_xor_sync(0xffffffffu, sums[half], 1);
    sums[half] += __shfl_xor_sync(0xffffffffu, sums[half], 2);
  }
  if (threadIdx.x % 4 == 0) {
    partial[column_warp * kBackwardChunk + m0 + tile_row()] = sums[0];
    partial[column_warp * kBackwardChunk + m0 + tile_row() + 8] = sums[1];
  }
}

template <int kColumnWarps> __device__ __forceinline__ float chunk_row_total(const float *partial, int r) {
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kColumnWarps; ++w)
    total += partial[w * kBackwardChunk + r];
  return total;
}

// dx of phi for one element of an elementwise feature map, from y = phi(x) (x > 0 exactly where y > 1 for elu + 1 and
// y > 0 for relu, so x itself is not needed).
template <int kPhi> __device__ __forceinline__ float feature_map_backward_element(float y, float dy) {
  if (kPhi == kPhiEluPlusOne)
    return y > 1.0f ? dy : dy * y;
  return y > 0.0f ? dy : 0.0f;
}

// The input gradients of phi for a warp's chunk tiles, in place: dy -> dx. y = phi(x) from its split in shared memory.
// Softmax needs the row's <dy, y> over all columns: partial sums, then a CTA barrier (every thread must call this).
// kBf16: y is split in bf16.
template <int D, int kPhi, int N, bool kBf16 = false>
__device__ __forceinline__ void chunk_feature_map_backward(float (&dy)[N][4], const unsigned short *y_hi,
                                                           const unsigned short *y_lo, bool active, float *partial) {
  using T = BackwardTiles<D>;
  const int m0 = T::chunk_m0(), n0 = T::chunk_n0();
  float y[N][4];
#pragma unroll
  for (int ni = 0; ni < N; ++ni)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      y[ni][e] =
          active ? split_value<kBf16>(y_hi, y_lo, chunk_row(m0, e) * T::kStride + chunk_column(n0, ni, e)) : 0.0f;
  if (kPhi == kPhiSoftmax) {
    float products[N][4];
#pragma unroll
    for (int ni = 0; ni < N; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        products[ni][e] = dy[ni][e] * y[ni][e];
    if (active)
      chunk_row_partials<N>(products, m0, T::chunk_column_warp(), partial);
    __syncthreads();
#pragma unroll
    for (int ni = 0; ni < N; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float inner = chunk_row_total<T::kChunkWarpsN>(partial, chunk_row(m0, e));
        dy[ni][e] = y[ni][e] * (dy[ni][e] - inner);
      }
  } else {
#pragma unroll
    for (int ni = 0; ni < N; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dy[ni][e] = feature_map_backward_element<kPhi>(y[ni][e], dy[ni][e]);
  }
}

// Stores a warp's chunk tiles (rows valid_rows and up are skipped) into out[row * D + column] (every lane of the warp
// calls it). Pairs of column tiles go 16 bytes per lane: a quad's lanes trade values so that lane q holds columns
// 4q..4q+3 of the pair's 16 (ncu counted half-used sectors for the fragments' 8-byte pieces); a lone tile, or all
// with kWide false (fewer registers), 8 bytes.
template <int D, int N, bool kWide = true>
__device__ __forceinline__ void store_chunk_rows(const float (&values)[N][4], float *out, int valid_rows) {
  using T = BackwardTiles<D>;
  const int m0 = T::chunk_m0(), n0 = T::chunk_n0();
  const int lane = threadIdx.x % 32, q = lane % 4, source = (lane & ~3) + 2 * (q % 2);
  constexpr int kPaired = kWide ? N / 2 * 2 : 0;
#pragma unroll
  for (int ni = 0; ni < kPaired; ni += 2)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float four[4];
#pragma unroll
      for (int k = 0; k < 2; ++k) { // columns 4q + 2k, +1: held by lane `source + k` in tile ni (q < 2) or ni + 1
        const float a0 = __shfl_sync(0xffffffffu, values[ni][2 * half], source + k);
        const float a1 = __shfl_sync(0xffffffffu, values[ni][2 * half + 1], source + k);
        const float b0 = __shfl_sync(0xffffffffu, values[ni + 1][2 * half], source + k);
        const float b1 = __shfl_sync(0xffffffffu, values[ni + 1][2 * half + 1], source + k);
        four[2 * k] = q < 2 ? a0 : b0;
        four[2 * k + 1] = q < 2 ? a1 : b1;
      }
      const int r = chunk_row(m0, 2 * half);
      if (r < valid_rows)
        *reinterpret_cast<float4 *>(out + static_cast<long long>(r) * D + n0 + 8 * ni + 4 * q) =
            make_float4(four[0], four[1], four[2], four[3]);
    }
#pragma unroll
  for (int ni = kPaired; ni < N; ++ni)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = chunk_row(m0, 2 * half);
      if (r < valid_rows)
        *reinterpret_cast<float2 *>(out + static_cast<long long>(r) * D + chunk_column(n0, ni, 2 * half)) =
            make_float2(values[ni][2 * half], values[ni][2 * half + 1]);
    }
}

} // namespace sage::device::sla
