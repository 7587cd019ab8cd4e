// The sparse part of SLA's backward (Algorithm 2, lines 2-3 and 7-12 over the critical blocks) on tensor cores:
// the statistics kernel (per q block: L, D^s and dO^s in f16) and the fused kv-major kernel (FlashAttention-2's
// backward over the critical pairs: dK, dV in registers, dQ by f32 reductions). f16 operands (Q, K, V exactly; dO^s, P
// and dS rounded to f16) with f32 accumulation, scores and their exponentials in f32. The fused kernel adds to dQ, dK
// and dV, which the linear branch's kernels wrote before it.
//
// Shared memory of the statistics kernel (dynamic, sage_sla_sparse_backward_shared_bytes): Q, dO^s (rows of the q
// block) and K, V (rows of a kv block) as f16 with rows padded by 8 halves; of the fused kernel:
// sage_sla_sparse_fused_shared_bytes, or on sm_90a (the wgmma kernel, sla/sparse_backward_sm90.cuh)
// sage_sla_sparse_fused_shared_bytes_sm90.
#pragma once

#include "sage/device/lanes.cuh"
#include "sage/device/sla/common.cuh"
#include "sage/device/sla/sparse_backward_sm90.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

// CTAs per SM the statistics kernel's registers are budgeted for (its launch bounds): three where shared memory holds
// three (sm_90, sm_100: 227 KiB; 168 registers, no spills at d = 128), one elsewhere (sm_80 holds two, sm_89 and sm_120
// one: a register cap would only spill).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1200
constexpr int kSparseRowsMinBlocks = 3;
#else
constexpr int kSparseRowsMinBlocks = 1;
#endif

template <int D, int BLOCK_Q, int BLOCK_KV> struct SparseBackwardLayout {
  static_assert(D % 16 == 0 && BLOCK_Q % 16 == 0 && BLOCK_KV % 16 == 0, "tiles of 16");
  static_assert(BLOCK_Q <= 128 && BLOCK_KV <= 128, "one warp per 16 rows, at most 8 warps");
  static constexpr int kStride = D + 8;
  static constexpr int kTileQ = BLOCK_Q * kStride, kTileKv = BLOCK_KV * kStride;
  static_assert(2 * (2 * kTileQ + 2 * kTileKv) + 8 * BLOCK_Q ==
                    sage_sla_sparse_backward_shared_bytes(D, BLOCK_Q, BLOCK_KV),
                "abi.cuh's size of the sparse backward's shared memory");
};

// The A fragment of the 16 x 16 slice (k = 16 s .. 16 s + 15) of a 16-row f32 accumulator held as 8-column tiles:
// tiles 2 s and 2 s + 1, rounded to f16 (kBf16: bf16; FlashAttention's P and dS stay in registers).
template <bool kBf16 = false>
__device__ __forceinline__ void accumulators_to_a(unsigned (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = pack_f16x2(element_bits<kBf16>(left[0]), element_bits<kBf16>(left[1]));
  a[1] = pack_f16x2(element_bits<kBf16>(left[2]), element_bits<kBf16>(left[3]));
  a[2] = pack_f16x2(element_bits<kBf16>(right[0]), element_bits<kBf16>(right[1]));
  a[3] = pack_f16x2(element_bits<kBf16>(right[2]), element_bits<kBf16>(right[3]));
}

// Asynchronous copies (cp.async, sm_80+): 16 bytes global -> shared without registers. Each stage_f16_rows call
// commits one group; wait_staged<N>() waits until at most the N most recent groups are in flight (then a barrier
// makes the rows visible to every warp).
__device__ __forceinline__ void copy_16_async(void *shared, const void *global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(shared)), "l"(global));
}
__device__ __forceinline__ void commit_staged() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait_staged() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// rows x D of an f16 tensor (rows from `first`, `valid` of them) into shared memory; rows past `valid` are 0. 16 bytes
// per asynchronous copy where the rows are 16-byte aligned (the usual contiguous layouts), 2 per load otherwise.
// Commits one group of copies (empty on the 2-byte path, which stores before it returns).
template <int D>
__device__ void stage_f16_rows(unsigned short *tile, int stride, const void *source, const SageSlaStrides &strides,
                               int b, int h, int first, int rows, int valid, int thread, int threads) {
  const unsigned short *base = static_cast<const unsigned short *>(source) + element_index(strides, b, h, first, 0);
  if (strides.token % 8 == 0 && reinterpret_cast<unsigned long long>(base) % 16 == 0) {
    for (int e = thread; e < rows * (D / 8); e += threads) {
      const int r = e / (D / 8), c = (e % (D / 8)) * 8;
      if (r < valid)
        copy_16_async(tile + r * stride + c, base + r * strides.token + c);
      else
        *reinterpret_cast<uint4 *>(tile + r * stride + c) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int e = thread; e < rows * D; e += threads) {
      const int r = e / D, c = e % D;
      tile[r * stride + c] = r < valid ? base[r * strides.token + c] : 0;
    }
  }
  commit_staged();
}

// rows x D of an f32 [.., tokens, D] tensor (dO^s) into shared memory as f16, 8 values per step; each thread loads
// eight steps (a 64 x 128 tile per 128 threads) before it stores them, so that their loads are in flight together.
// `copy` (optional, [.., tokens, D] f16 like `source`): the valid rows also go there, for a later kernel's cp.async.
// kBf16: rounded to bf16 instead.
template <int D, bool kBf16 = false>
__device__ void stage_f32_rows(unsigned short *tile, int stride, const float *source, int first, int rows, int valid,
                               int thread, int threads, unsigned short *copy = nullptr) {
  constexpr int kBatch = 8;
  const float *base = source + static_cast<long long>(first) * D;
  const bool vector = reinterpret_cast<unsigned long long>(base) % 16 == 0;
  const int steps = rows * (D / 8);
  for (int e0 = thread; e0 < steps; e0 += kBatch * threads) {
    float values[kBatch][8];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * threads, r = e / (D / 8), c = (e % (D / 8)) * 8;
      if (e >= steps || r >= valid) {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          values[u][k] = 0.0f;
      } else if (vector) {
        const float4 left = *reinterpret_cast<const float4 *>(base + r * D + c);
        const float4 right = *reinterpret_cast<const float4 *>(base + r * D + c + 4);
        values[u][0] = left.x, values[u][1] = left.y, values[u][2] = left.z, values[u][3] = left.w;
        values[u][4] = right.x, values[u][5] = right.y, values[u][6] = right.z, values[u][7] = right.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          values[u][k] = base[r * D + c + k];
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * threads, r = e / (D / 8), c = (e % (D / 8)) * 8;
      if (e < steps) {
        const uint4 packed =
            make_uint4(pack_f16x2(element_bits<kBf16>(values[u][0]), element_bits<kBf16>(values[u][1])),
                       pack_f16x2(element_bits<kBf16>(values[u][2]), element_bits<kBf16>(values[u][3])),
                       pack_f16x2(element_bits<kBf16>(values[u][4]), element_bits<kBf16>(values[u][5])),
                       pack_f16x2(element_bits<kBf16>(values[u][6]), element_bits<kBf16>(values[u][7])));
        *reinterpret_cast<uint4 *>(tile + r * stride + c) = packed;
        if (copy != nullptr && r < valid)
          *reinterpret_cast<uint4 *>(copy + (static_cast<long long>(first) + r) * D + c) = packed;
      }
    }
  }
}

// Two neighbouring B operands of load_b (16 x 8 at (k0, n0) and at (k0, n0 + 8)) with one ldmatrix.x4: half the
// shared-memory load instructions (the ncu profile of these kernels: latency-bound at ~1.4-2.2 instructions per cycle).
template <bool kBKMajor> __device__ __forceinline__ void load_b_pair(unsigned (&b)[2][2], SharedF16 s, int k0, int n0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, row = lane % 8;
  // Matrix order: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
  const int k = k0 + (matrix & 1) * 8, n = n0 + (matrix >> 1) * 8;
  const unsigned short *at = kBKMajor ? s.base + (k + row) * s.stride + n : s.base + (n + row) * s.stride + k;
  unsigned r[4];
  ldmatrix_x4<kBKMajor>(r, shared_address(at));
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// 2^x by the SFU (ex2.approx: ~2 ulp), for exp(x) = 2^(x log2 e) with log2 e folded into the scale: one instruction
// instead of expf's range reduction.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// c[n] = A[m0:m0+16, 0:D] B[0:D, 8n:8n+8] for n < N / 8, with A and B^T both stored [row][feature] (Q K^T, V dO^T,
// K Q^T, dO V^T). kBf16 (here and in the products below): bf16 operands.
template <int D, int N, bool kBf16 = false>
__device__ __forceinline__ void mma_rows_by_rows(float (&c)[N / 8][4], SharedF16 a, SharedF16 b, int m0) {
  clear_tiles(c);
#pragma unroll 1 // the accumulators are the register budget: no operand prefetch across steps
  for (int k0 = 0; k0 < D; k0 += 16) {
    unsigned fragment[4];
    load_a<false>(fragment, a, m0, k0);
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      unsigned bf[2][2];
      load_b_pair<false>(bf, b, k0, n * 8);
      mma_16bit<kBf16>(c[n], fragment, bf[0]);
      mma_16bit<kBf16>(c[n + 1], fragment, bf[1]);
    }
  }
}

// c[n] += P[16 x K] B[0:K, 8n:8n+8] for n < D / 8, with P in registers (K / 8 accumulator tiles) and B stored
// [k][feature] (P V, dS K, P^T dO, dS^T Q).
template <int K, int D, bool kBf16 = false>
__device__ __forceinline__ void mma_registers_by_rows(float (&c)[D / 8][4], const float (&p)[K / 8][4], SharedF16 b) {
#pragma unroll
  for (int s = 0; s < K / 16; ++s) {
    unsigned fragment[4];
    accumulators_to_a<kBf16>(fragment, p[2 * s], p[2 * s + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      unsigned bf[2][2];
      load_b_pair<true>(bf, b, s * 16, n * 8);
      mma_16bit<kBf16>(c[n], fragment, bf[0]);
      mma_16bit<kBf16>(c[n + 1], fragment, bf[1]);
    }
  }
}

// P as f16 A fragments (half the registers of its f32 accumulators), and the product with B stored [k][feature].
template <int K, bool kBf16 = false>
__device__ __forceinline__ void pack_fragments(unsigned (&a)[K / 16][4], const float (&p)[K / 8][4]) {
#pragma unroll
  for (int s = 0; s < K / 16; ++s)
    accumulators_to_a<kBf16>(a[s], p[2 * s], p[2 * s + 1]);
}
// Element e of accumulator tile t, as pack_fragments rounded it.
template <int K, bool kBf16 = false>
__device__ __forceinline__ float fragment_value(const unsigned (&a)[K / 16][4], int t, int e) {
  const unsigned word = a[t / 2][(t % 2) * 2 + e / 2];
  return element_value<kBf16>(static_cast<unsigned short>(e % 2 == 0 ? word & 0xffffu : word >> 16));
}
template <int K, int D, bool kBf16 = false>
__device__ __forceinline__ void mma_fragments_by_rows(float (&c)[D / 8][4], const unsigned (&a)[K / 16][4],
                                                      SharedF16 b) {
#pragma unroll
  for (int s = 0; s < K / 16; ++s)
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      unsigned bf[2][2];
      load_b_pair<true>(bf, b, s * 16, n * 8);
      mma_16bit<kBf16>(c[n], a[s], bf[0]);
      mma_16bit<kBf16>(c[n + 1], a[s], bf[1]);
    }
}

// Two independent products of mma_rows_by_rows (c = A B, e = F G, same m0) in one loop over k: twice the
// independent tensor-core work between the operand loads of a step (the fused kernel runs 2 warps per scheduler).
template <int D, int N, bool kBf16 = false>
__device__ __forceinline__ void mma_two_rows_by_rows(float (&c)[N / 8][4], SharedF16 a, SharedF16 b,
                                                     float (&e)[N / 8][4], SharedF16 f, SharedF16 g, int m0) {
#pragma unroll
  for (int n = 0; n < N / 8; ++n)
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      c[n][x] = 0.0f;
      e[n][x] = 0.0f;
    }
#pragma unroll 1 // two sets of accumulators beside dK and dV: no operand prefetch across steps
  for (int k0 = 0; k0 < D; k0 += 16) {
    unsigned fa[4], ff[4];
    load_a<false>(fa, a, m0, k0);
    load_a<false>(ff, f, m0, k0);
#pragma unroll
    for (int n = 0; n < N / 8; n += 2) {
      unsigned bb[2][2], bg[2][2];
      load_b_pair<false>(bb, b, k0, n * 8);
      load_b_pair<false>(bg, g, k0, n * 8);
      mma_16bit<kBf16>(c[n], fa, bb[0]);
      mma_16bit<kBf16>(e[n], ff, bg[0]);
      mma_16bit<kBf16>(c[n + 1], fa, bb[1]);
      mma_16bit<kBf16>(e[n + 1], ff, bg[1]);
    }
  }
}
// Two independent products of mma_fragments_by_rows (c += A B, e += F G) in one loop.
template <int K, int D, bool kBf16 = false>
__device__ __forceinline__ void mma_two_fragments_by_rows(float (&c)[D / 8][4], const unsigned (&a)[K / 16][4],
                                                          SharedF16 b, float (&e)[D / 8][4],
                                                          const unsigned (&f)[K / 16][4], SharedF16 g) {
#pragma unroll
  for (int s = 0; s < K / 16; ++s)
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      unsigned bb[2][2], bg[2][2];
      load_b_pair<true>(bb, b, s * 16, n * 8);
      load_b_pair<true>(bg, g, s * 16, n * 8);
      mma_16bit<kBf16>(c[n], a[s], bb[0]);
      mma_16bit<kBf16>(e[n], f[s], bg[0]);
      mma_16bit<kBf16>(c[n + 1], a[s], bb[1]);
      mma_16bit<kBf16>(e[n + 1], f[s], bg[1]);
    }
}

// Statistics kernel (launch 2c): one q block of one q head, BLOCK_Q / 16 warps, over the critical kv blocks: L
// (online softmax) and O^s, then D^s = rowsum(dO^s o O^s) (dO^s in f32). Writes L, D^s and dO^s as f16 for the fused
// kernel. kBf16: Q, K, V are bf16, and the products run on bf16 operands (dO^s, P rounded to bf16).
template <int D, int BLOCK_Q, int BLOCK_KV, bool kBf16>
__device__ void sparse_row_statistics(const SageSlaSparseBackwardParams &p) {
  using L = SparseBackwardLayout<D, BLOCK_Q, BLOCK_KV>;
  constexpr int kThreadsHere = BLOCK_Q * 2, kKeyTiles = BLOCK_KV / 8, kFeatureTiles = D / 8;
  if (p.lse_saved != nullptr && *p.lse_saved != 0)
    return; // the forward saved L: the delta kernel wrote D^s and dO^s
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *q_tile = reinterpret_cast<unsigned short *>(shared_bytes);
  unsigned short *do_tile = q_tile + L::kTileQ, *k_tile = do_tile + L::kTileQ, *v_tile = k_tile + L::kTileKv;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x, warp = threadIdx.x / 32;
  const int h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const long long row_block = head * p.shape.q_blocks + i;
  const int begin = i * BLOCK_Q, valid_rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
  const float *d_out = p.d_sparse + head * p.shape.tokens_q * D;
  stage_f16_rows<D>(q_tile, L::kStride, p.q, p.q_strides, b, h, begin, BLOCK_Q, valid_rows, threadIdx.x, kThreadsHere);
  unsigned short *d_out_f16 = p.d_sparse_f16 + head * p.shape.tokens_q * D;
  stage_f32_rows<D, kBf16>(do_tile, L::kStride, d_out, begin, BLOCK_Q, valid_rows, threadIdx.x, kThreadsHere,
                           d_out_f16);
  const SharedF16 q_rows{q_tile, L::kStride}, do_rows{do_tile, L::kStride};
  const SharedF16 k_rows{k_tile, L::kStride}, v_rows{v_tile, L::kStride};
  const int *critical = p.critical_lut + row_block * p.shape.critical_per_row;
  const int count = p.shape.critical_per_row;
  const int m0 = warp * 16, row_top = m0 + tile_row(), row_bottom = row_top + 8; // this lane's two rows
  const float negative_infinity = -__int_as_float(0x7f800000);
  const float scale_log2 = p.scale * kLog2e; // exponents in log2 units
  // Block n's K or V into its tile, one group of copies; past the last block, an empty group (the waits count groups).
  auto stage_block = [&](unsigned short *tile, const void *source, const SageSlaStrides &strides, int n) {
    if (n >= count) {
      commit_staged();
      return;
    }
    const int key_begin = critical[n] * BLOCK_KV, keys = min(p.shape.tokens_kv, key_begin + BLOCK_KV) - key_begin;
    stage_f16_rows<D>(tile, L::kStride, source, strides, b, h_kv, key_begin, BLOCK_KV, keys, threadIdx.x, kThreadsHere);
  };

  float lse[2], delta[2];
  {
    float row_max[2] = {negative_infinity, negative_infinity}, row_sum[2] = {0.0f, 0.0f};
    float o[kFeatureTiles][4];
    clear_tiles(o);
    // K_{n+1} loads during P V_n, V_{n+1} during S_{n+1} (groups in the order K_0, V_0, K_1, V_1, ...).
    stage_block(k_tile, p.k, p.k_strides, 0);
    stage_block(v_tile, p.v, p.v_strides, 0);
    for (int n = 0; n < count; ++n) {
      const int key_begin = critical[n] * BLOCK_KV, keys = min(p.shape.tokens_kv, key_begin + BLOCK_KV) - key_begin;
      wait_staged<1>(); // K_n (and Q) landed; V_n may be in flight
      __syncthreads();
      float s[kKeyTiles][4];
      mma_rows_by_rows<D, BLOCK_KV, kBf16>(s, q_rows, k_rows, m0);
      float block_max[2] = {negative_infinity, negative_infinity};
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = t * 8 + tile_col() + (e & 1);
          s[t][e] = key < keys ? s[t][e] * scale_log2 : negative_infinity; // log2 units
          block_max[e / 2] = fmaxf(block_max[e / 2], s[t][e]);
        }
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(row_max[r], quad_max(block_max[r]));
        alpha[r] = row_max[r] == negative_infinity ? 0.0f : exp2_approx(row_max[r] - m_new);
        row_max[r] = m_new;
        row_sum[r] *= alpha[r];
      }
#pragma unroll
      for (int t = 0; t < kKeyTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[t][e] = s[t][e] == negative_infinity ? 0.0f : exp2_approx(s[t][e] - row_max[e / 2]);
          row_sum[e / 2] += s[t][e];
        }
#pragma unroll
      for (int n = 0; n < kFeatureTiles; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          o[n][e] *= alpha[e / 2];
      __syncthreads(); // every warp is done with K_n
      stage_block(k_tile, p.k, p.k_strides, n + 1);
      wait_staged<1>(); // V_n landed
      __syncthreads();
      mma_registers_by_rows<BLOCK_KV, D, kBf16>(o, s, v_rows);
      __syncthreads(); // every warp is done with V_n
      stage_block(v_tile, p.v, p.v_strides, n + 1);
    }
    float dot[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r)
      row_sum[r] = quad_sum(row_sum[r]);
#pragma unroll
    for (int n = 0; n < kFeatureTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e < 2 ? row_top : row_bottom, col = n * 8 + tile_col() + (e & 1);
        if (row < valid_rows)
          dot[e / 2] += d_out[static_cast<long long>(begin + row) * D + col] * (o[n][e] / row_sum[e / 2]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lse[r] = row_max[r] * kLn2 + logf(row_sum[r]);
      delta[r] = quad_sum(dot[r]);
      const int row = r == 0 ? row_top : row_bottom;
      if (threadIdx.x % 4 == 0 && row < valid_rows) {
        p.lse[head * p.shape.tokens_q + begin + row] = lse[r];
        p.delta[head * p.shape.tokens_q + begin + row] = delta[r];
      }
    }
  }

  wait_staged<0>(); // no copy outlives the CTA (a row with no critical block)
}

// Delta kernel (launch 2d, instead of 2c where the forward saved L): one q block of one q head, 256 threads.
// D^s = rowsum(dO^s o O^s) with the forward's O^s (f16, as FlashAttention-2 forms D from the saved O) and dO^s in
// f32; dO^s also goes out as f16 for the fused kernel. kLanes = D / 4 lanes per row, 4 columns each (16 bytes of dO^s,
// 8 of O^s); a thread loads all its rows before it reduces, so that their loads are in flight together. kBf16: O^s is
// bf16, and dO^s goes out as bf16.
template <int D, int BLOCK_Q, bool kBf16> __device__ void sparse_row_delta(const SageSlaSparseDeltaParams &p) {
  constexpr int kThreadsHere = 256, kLanes = D / 4, kRowsPerPass = kThreadsHere / kLanes;
  constexpr int kPasses = (BLOCK_Q + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(D % 4 == 0 && kLanes <= 32 && 32 % kLanes == 0, "a row's lanes within one warp");
  if (p.lse_saved == nullptr || *p.lse_saved == 0)
    return; // no saved L: the statistics kernel computes D^s and dO^s
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x;
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const int begin = i * BLOCK_Q, valid_rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
  const int lane = threadIdx.x % kLanes, c0 = lane * 4, first = threadIdx.x / kLanes;
  const float *d_out = p.d_sparse + (head * p.shape.tokens_q + begin) * D;
  const unsigned short *o =
      static_cast<const unsigned short *>(p.o_sparse) + element_index(p.o_sparse_strides, b, h, begin, 0);
  unsigned short *d_out_f16 = p.d_sparse_f16 + (head * p.shape.tokens_q + begin) * D;
  float4 gradient[kPasses];
  unsigned short output[kPasses][4];
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = first + pass * kRowsPerPass;
    gradient[pass] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int c = 0; c < 4; ++c)
      output[pass][c] = 0;
    if (row >= valid_rows)
      continue;
    const float *g = d_out + static_cast<long long>(row) * D + c0;
    if (reinterpret_cast<unsigned long long>(g) % 16 == 0)
      gradient[pass] = *reinterpret_cast<const float4 *>(g);
    else
      gradient[pass] = make_float4(g[0], g[1], g[2], g[3]);
    const unsigned short *x = o + row * p.o_sparse_strides.token + c0;
    if (reinterpret_cast<unsigned long long>(x) % 8 == 0) {
      const uint2 bits = *reinterpret_cast<const uint2 *>(x);
      output[pass][0] = static_cast<unsigned short>(bits.x & 0xffffu);
      output[pass][1] = static_cast<unsigned short>(bits.x >> 16);
      output[pass][2] = static_cast<unsigned short>(bits.y & 0xffffu);
      output[pass][3] = static_cast<unsigned short>(bits.y >> 16);
    } else {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        output[pass][c] = x[c];
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int row = first + pass * kRowsPerPass;
    const float4 g = gradient[pass];
    float dot = g.x * element_value<kBf16>(output[pass][0]) + g.y * element_value<kBf16>(output[pass][1]) +
                g.z * element_value<kBf16>(output[pass][2]) + g.w * element_value<kBf16>(output[pass][3]);
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) // the row's lanes: kLanes consecutive ones of a warp
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (row < valid_rows) {
      unsigned short *y = d_out_f16 + static_cast<long long>(row) * D + c0;
      *reinterpret_cast<uint2 *>(y) = make_uint2(pack_f16x2(element_bits<kBf16>(g.x), element_bits<kBf16>(g.y)),
                                                 pack_f16x2(element_bits<kBf16>(g.z), element_bits<kBf16>(g.w)));
      if (lane == 0)
        p.delta[head * p.shape.tokens_q + begin + row] = dot;
    }
  }
}

// dQ's f32 reductions: two neighbouring columns in one vector reduction on sm_90 and later, two scalar ones before.
__device__ __forceinline__ void reduce_add_pair(float *at, float first, float second) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(at), "f"(first), "f"(second) : "memory");
#else
  atomicAdd(at, first);
  atomicAdd(at + 1, second);
#endif
}

template <int D, int BLOCK_Q, int BLOCK_KV> struct SparseFusedLayout {
  static_assert(D % 16 == 0 && BLOCK_Q % 16 == 0 && BLOCK_KV % 16 == 0, "tiles of 16");
  static_assert(BLOCK_Q <= 128 && BLOCK_KV <= 128, "one warp per 16 keys, at most 8 warps");
#if defined(__CUDA_ARCH__)
  static constexpr int kStages = sage_sla_sparse_fused_stages(__CUDA_ARCH__ / 10);
#else
  static constexpr int kStages = 1;
#endif
  static constexpr int kStride = D + 8, kDsStride = BLOCK_Q + 8;
  static constexpr int kTileQ = BLOCK_Q * kStride, kTileKv = BLOCK_KV * kStride, kTileDs = BLOCK_KV * kDsStride;
  static_assert(2 * (2 * kTileKv + kTileDs + kStages * 2 * kTileQ) + kStages * 8 * BLOCK_Q ==
                    sage_sla_sparse_fused_shared_bytes(D, BLOCK_Q, BLOCK_KV, kStages),
                "abi.cuh's size of the fused sparse backward's shared memory");
};

// Fused kernel (launch 4c), FlashAttention-2's backward over the critical pairs of one work unit (a kv block's pairs,
// or a share of them: abi.cuh's sage_sla_sparse_unit_capacity): one kv block of one kv head, BLOCK_KV / 16 warps (one
// per 16 keys), K and V staged once; per critical q block of each q head of the GQA group: P^T = exp(K Q^T / sqrt(d) -
// L), dV += P^T dO^s, dP^T = V dO^s^T, dS^T = P^T o (dP^T - D^s), dK += dS^T Q / sqrt(d) (registers), and dQ += dS K /
// sqrt(d) through shared memory (dS^T, f16) and f32 reductions. S and exp are computed once per pair (the rows and kv
// kernels computed them three times). Q, dO^s (the statistics kernel's f16 copy), L and D^s of the next q block load
// during this one's products where there are two stages. kBf16: Q, K, V and the dO^s copy are bf16, and so are the
// products' operands (P^T, dS^T rounded to bf16).
template <int D, int BLOCK_Q, int BLOCK_KV, bool kBf16>
__device__ void sparse_fused_backward_mma_sync(const SageSlaSparseBackwardParams &p) {
  using L = SparseFusedLayout<D, BLOCK_Q, BLOCK_KV>;
  constexpr int kThreadsHere = BLOCK_KV * 2, kWarps = BLOCK_KV / 16, kQueryTiles = BLOCK_Q / 8;
  constexpr int kFeatureTiles = D / 8, kChunk = D < 64 ? D : 64; // dQ's columns per pass (its accumulators)
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *k_tile = reinterpret_cast<unsigned short *>(shared_bytes);
  unsigned short *v_tile = k_tile + L::kTileKv, *ds_tile = v_tile + L::kTileKv, *stage_tiles = ds_tile + L::kTileDs;
  float *stage_stats = reinterpret_cast<float *>(stage_tiles + L::kStages * 2 * L::kTileQ);
  if (static_cast<int>(blockIdx.x) >= *p.sparse_unit_count) // the grid bounds the units launch 4 listed
    return;
  const SparseUnit unit = sparse_unit(p.sparse_units, blockIdx.x, p.shape);
  const int b = unit.b, h_kv = unit.h_kv, j = unit.j, warp = threadIdx.x / 32;
  const int group = p.shape.heads_q / p.shape.heads_kv, q_blocks = p.shape.q_blocks;
  const int h_begin = h_kv * group, h_end = h_begin + group;
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  const int key_begin = j * BLOCK_KV, valid_keys = min(p.shape.tokens_kv, key_begin + BLOCK_KV) - key_begin;
  const long long tokens_q = p.shape.tokens_q;
  const SageSlaStrides do_strides{p.shape.heads_q * tokens_q * D, tokens_q * D, D}; // the f16 copy: contiguous
  stage_f16_rows<D>(k_tile, L::kStride, p.k, p.k_strides, b, h_kv, key_begin, BLOCK_KV, valid_keys, threadIdx.x,
                    kThreadsHere);
  stage_f16_rows<D>(v_tile, L::kStride, p.v, p.v_strides, b, h_kv, key_begin, BLOCK_KV, valid_keys, threadIdx.x,
                    kThreadsHere);
  const SharedF16 k_rows{k_tile, L::kStride}, v_rows{v_tile, L::kStride}, ds_rows{ds_tile, L::kDsStride};
  const int m0 = warp * 16, key_top = m0 + tile_row(), key_bottom = key_top + 8;
  const float scale_log2 = p.scale * kLog2e;

  // The work list: (q head h, n-th critical q block of the column), heads in order; `count` is the column's. This CTA
  // takes the unit's items.
  const CriticalColumnList list{p.column_counts, p.critical_columns, b, p.shape.heads_q, p.shape.kv_blocks, j,
                                q_blocks};
  auto count_of = [&](int h) { return list.count(h); };
  auto block_of = [&](int h, int n) { return list.block(h, n); };
  auto skip_empty = [&](int &h, int &n) { // to the next existing item from (h, n), or h == h_end
    while (h < h_end && n >= count_of(h)) {
      ++h;
      n = 0;
    }
  };
  // Q, dO^s, L and D^s of item (h, n) into stage s: two groups of copies (Q with L and D^s, then dO^s).
  auto issue = [&](int h, int n, int s) {
    if (h >= h_end)
      return;
    const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
    const int begin = block_of(h, n) * BLOCK_Q, rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
    unsigned short *q_tile = stage_tiles + s * 2 * L::kTileQ;
    float *stats = stage_stats + s * 2 * BLOCK_Q;
    for (int r = threadIdx.x; r < 2 * BLOCK_Q; r += kThreadsHere) {
      const int row = r % BLOCK_Q;
      if (row < rows)
        copy_4_async(stats + r, (r < BLOCK_Q ? p.lse : p.delta) + head * tokens_q + begin + row);
      else
        stats[r] = 0.0f;
    }
    stage_f16_rows<D>(q_tile, L::kStride, p.q, p.q_strides, b, h, begin, BLOCK_Q, rows, threadIdx.x, kThreadsHere);
    stage_f16_rows<D>(q_tile + L::kTileQ, L::kStride, p.d_sparse_f16, do_strides, b, h, begin, BLOCK_Q, rows,
                      threadIdx.x, kThreadsHere);
  };

  float dk[kFeatureTiles][4], dv[kFeatureTiles][4];
#pragma unroll
  for (int n = 0; n < kFeatureTiles; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dk[n][e] = 0.0f;
      dv[n][e] = 0.0f;
    }
  int h = unit.h_first, n = unit.n_first, stage = 0, left = unit.items; // left: items from (h, n) on
  issue(h, n, 0);
  while (h < h_end) {
    int next_h = left > 1 ? h : h_end, next_n = n + 1;
    skip_empty(next_h, next_n);
    wait_staged<0>(); // this item's Q, dO^s, L, D^s (and, the first time, K and V) landed
    __syncthreads();  // ... for every warp; and every warp is done with the previous item (its stage, dS^T)
    if constexpr (L::kStages == 2)
      issue(next_h, next_n, stage ^ 1);
    const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
    const int begin = block_of(h, n) * BLOCK_Q, rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
    const unsigned short *q_tile = stage_tiles + stage * 2 * L::kTileQ;
    const SharedF16 q_rows{q_tile, L::kStride}, do_rows{q_tile + L::kTileQ, L::kStride};
    const float *lse = stage_stats + stage * 2 * BLOCK_Q, *delta = lse + BLOCK_Q;

    // S^T = K Q^T and dP^T = V dO^s^T together, then P^T and dS^T = P^T o (dP^T - D^s) as f16 A operands, then
    // dV += P^T dO^s and dK += dS^T Q together.
    unsigned p_fragments[BLOCK_Q / 16][4], ds_fragments[BLOCK_Q / 16][4];
    {
      float s[kQueryTiles][4], ds[kQueryTiles][4];
      mma_two_rows_by_rows<D, BLOCK_Q, kBf16>(s, k_rows, q_rows, ds, v_rows, do_rows, m0);
#pragma unroll
      for (int t = 0; t < kQueryTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = t * 8 + tile_col() + (e & 1);
          s[t][e] = query < rows ? exp2_approx(s[t][e] * scale_log2 - lse[query] * kLog2e) : 0.0f; // P^T
        }
      pack_fragments<BLOCK_Q, kBf16>(p_fragments, s);
#pragma unroll
      for (int t = 0; t < kQueryTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int query = t * 8 + tile_col() + (e & 1);
          ds[t][e] =
              fragment_value<BLOCK_Q, kBf16>(p_fragments, t, e) * (ds[t][e] - delta[query]); // 0 past the q block
        }
      pack_fragments<BLOCK_Q, kBf16>(ds_fragments, ds);
    }
    // This warp's 16 rows of dS^T into shared memory ([key][query], f16): dQ needs every warp's keys.
#pragma unroll
    for (int t = 0; t < BLOCK_Q / 16; ++t) {
      unsigned short *top = ds_tile + key_top * L::kDsStride + t * 16 + tile_col();
      unsigned short *bottom = top + 8 * L::kDsStride;
      *reinterpret_cast<unsigned *>(top) = ds_fragments[t][0];
      *reinterpret_cast<unsigned *>(bottom) = ds_fragments[t][1];
      *reinterpret_cast<unsigned *>(top + 8) = ds_fragments[t][2];
      *reinterpret_cast<unsigned *>(bottom + 8) = ds_fragments[t][3];
    }
    mma_two_fragments_by_rows<BLOCK_Q, D, kBf16>(dv, p_fragments, do_rows, dk, ds_fragments, q_rows);
    __syncthreads(); // dS^T complete
    // dQ[q block] += dS K / sqrt(d): warp w takes the q rows 16 w, 16 (w + warps), ..., kChunk columns at a time.
    float *dq = p.dq + (head * tokens_q + begin) * D;
    for (int qt = warp; qt < BLOCK_Q / 16; qt += kWarps)
#pragma unroll 1
      for (int c0 = 0; c0 < D; c0 += kChunk) {
        float acc[kChunk / 8][4];
        clear_tiles(acc);
#pragma unroll
        for (int k0 = 0; k0 < BLOCK_KV; k0 += 16) {
          unsigned a[4];
          load_a<true>(a, ds_rows, qt * 16, k0); // dS = (dS^T)^T
#pragma unroll
          for (int t = 0; t < kChunk / 8; t += 2) {
            unsigned bf[2][2];
            load_b_pair<true>(bf, k_rows, k0, c0 + t * 8);
            mma_16bit<kBf16>(acc[t], a, bf[0]);
            mma_16bit<kBf16>(acc[t + 1], a, bf[1]);
          }
        }
        const int row_top = qt * 16 + tile_row();
#pragma unroll
        for (int t = 0; t < kChunk / 8; ++t) {
          const int col = c0 + t * 8 + tile_col();
          if (row_top < rows)
            reduce_add_pair(dq + row_top * D + col, acc[t][0] * p.scale, acc[t][1] * p.scale);
          if (row_top + 8 < rows)
            reduce_add_pair(dq + (row_top + 8) * D + col, acc[t][2] * p.scale, acc[t][3] * p.scale);
        }
      }
    if constexpr (L::kStages == 1) {
      __syncthreads(); // every warp is done with the stage
      issue(next_h, next_n, 0);
    } else {
      stage ^= 1;
    }
    h = next_h;
    n = next_n;
    --left;
  }
  wait_staged<0>(); // no copy outlives the CTA
#pragma unroll
  for (int t = 0; t < kFeatureTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = e < 2 ? key_top : key_bottom, col = t * 8 + tile_col() + (e & 1);
      if (key < valid_keys) {
        const long long at = (head_kv * p.shape.tokens_kv + key_begin + key) * D + col;
        if (unit.shared) { // other CTAs add to these rows too
          atomicAdd(p.dk + at, dk[t][e] * p.scale);
          atomicAdd(p.dv + at, dv[t][e]);
        } else {
          p.dk[at] += dk[t][e] * p.scale;
          p.dv[at] += dv[t][e];
        }
      }
    }
}

// The fused kernel's entry: the wgmma kernel (sla/sparse_backward_sm90.cuh) on sm_90a for the shapes abi.cuh's
// sage_sla_sparse_fused_wgmma names (the host sizes shared memory by the same function), mma.sync elsewhere and in a
// bf16 module.
template <int D, int BLOCK_Q, int BLOCK_KV, bool kBf16>
__device__ void sparse_fused_backward(const SageSlaSparseBackwardParams &p) {
#if SAGE_SLA_SPARSE_FUSED_SM90
  if constexpr (sage_sla_sparse_fused_wgmma(90, D, BLOCK_Q, BLOCK_KV, kBf16))
    sparse_fused_backward_wgmma<D, BLOCK_Q, BLOCK_KV>(p);
  else
#endif
    sparse_fused_backward_mma_sync<D, BLOCK_Q, BLOCK_KV, kBf16>(p);
}

} // namespace sage::device::sla
