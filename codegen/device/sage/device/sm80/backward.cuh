// SageBwd on mma.sync (sm_80 and later; issue 12): SageAttention3's Algorithm 3 in four launches.
//
//   preprocess_q  (Q block, head_q, batch): psi(Q_i) and psi(dO_i), int8 with one scale per 64-token block, in the
//                 natural and the transposed tile layout; D_i = rowsum(dO_i o O_i); dq_accum zeroed.
//   preprocess_k  (KV block, head_kv, batch): psi(K_j), natural and transposed.
//   main          (KV block, head_kv, batch): FlashAttention-2's backward order. K_j, V_j stay in shared memory; for
//                 each query head of the GQA group and each visible Q tile i, 4 warps of 16 keys each compute
//                 S^T = K^ Q^^T (int8), P^T = exp2(S^T * scale * log2 e - L * log2 e), dP^T = V dO^T (f16/bf16, kept
//                 in 16 bits as Algorithm 3 line 8 says), dS^T = P^T o (dP^T - D); P and dS get one int8 scale per
//                 64 x 64 tile (a block reduction); then dV_j += P^T dO^ and dK_j += dS^T Q^ in registers (f32, summed
//                 over the group's query heads without atomics) and dQ_i += dS K^ by f32 atomics.
//   write_dq      (Q block, head_q, batch): dq_accum -> dQ in the input type.
//
// Why atomics for dQ: a CTA owns one KV tile and visits every Q tile, so dQ_i gets one partial sum per KV tile.
// Keeping dQ_i in registers would need the transposed loop order (a second pass recomputing S, P and dS per Q tile,
// i.e. twice the int8 Q.K^T and the 16-bit dO.V^T); f32 atomics into an L2-resident buffer cost one reduction per
// element per KV tile and keep one pass. The price: dQ's summation order varies between runs (last-bit noise).
//
// Operands are read from shared memory straight into the mma fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32"
// and "m16n8k16": g = lane / 4, t = lane % 4). Every operand is stored with its reduction axis contiguous, which is
// why the prologue writes Q, K and dO codes transposed as well: 8-bit operands have no ldmatrix.trans.
#pragma once

#include "sage/device/sm80/backward_params.cuh"
#include "sage/device/sm90/common.cuh"

namespace sage::device::sm80::backward {

using sm90::decode_input_element;
using sm90::fast_exp2;
using sm90::negative_infinity;
using sm90::pack_bf16x2;
using sm90::pack_f16x2;

constexpr int kBlock = 64; // b_q = b_kv: the P/dS tile and the scale blocks of Q, K, dO
constexpr int kWarps = 4;  // 16 keys each
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory of `main`: K^, K^^T, V, Q^, Q^^T, dO, dO^^T tiles, the P^T / dS^T / dS code tiles, row statistics.
template <class Config>
constexpr int kMainSharedBytes = kBlock *Config::kHeadDim * 9 + 3 * kBlock *kBlock + (2 * kBlock + 8) * 4;

// ---- mma.sync ----------------------------------------------------------------------------------------------------
__device__ __forceinline__ void mma_s8(int (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <bool kBf16>
__device__ __forceinline__ void mma_16bit(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (kBf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned load32(const void *address) { return *static_cast<const unsigned *>(address); }

// A (16 x 32 int8, row-major) at rows row0.. and columns k0.. of a matrix with `stride` bytes per row.
__device__ __forceinline__ void load_a_s8(unsigned (&a)[4], const signed char *matrix, int stride, int row0, int k0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  a[0] = load32(matrix + (row0 + g) * stride + k0 + 4 * t);
  a[1] = load32(matrix + (row0 + g + 8) * stride + k0 + 4 * t);
  a[2] = load32(matrix + (row0 + g) * stride + k0 + 16 + 4 * t);
  a[3] = load32(matrix + (row0 + g + 8) * stride + k0 + 16 + 4 * t);
}

// B (32 x 8 int8, column-major): columns n0.. stored as rows of `stride` bytes, k contiguous.
__device__ __forceinline__ void load_b_s8(unsigned (&b)[2], const signed char *matrix, int stride, int n0, int k0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  b[0] = load32(matrix + (n0 + g) * stride + k0 + 4 * t);
  b[1] = load32(matrix + (n0 + g) * stride + k0 + 16 + 4 * t);
}

// A (16 x 16 16-bit, row-major) and B (16 x 8, column-major), `stride` in elements.
__device__ __forceinline__ void load_a_16bit(unsigned (&a)[4], const unsigned short *matrix, int stride, int row0,
                                             int k0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  a[0] = load32(matrix + (row0 + g) * stride + k0 + 2 * t);
  a[1] = load32(matrix + (row0 + g + 8) * stride + k0 + 2 * t);
  a[2] = load32(matrix + (row0 + g) * stride + k0 + 8 + 2 * t);
  a[3] = load32(matrix + (row0 + g + 8) * stride + k0 + 8 + 2 * t);
}

__device__ __forceinline__ void load_b_16bit(unsigned (&b)[2], const unsigned short *matrix, int stride, int n0,
                                             int k0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  b[0] = load32(matrix + (n0 + g) * stride + k0 + 2 * t);
  b[1] = load32(matrix + (n0 + g) * stride + k0 + 8 + 2 * t);
}

// ---- helpers -----------------------------------------------------------------------------------------------------
// The maximum of `value` over the CTA (`scratch`: kWarps floats). Synchronizes the CTA twice.
__device__ __forceinline__ float block_max(float value, float *scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if ((threadIdx.x & 31) == 0)
    scratch[threadIdx.x >> 5] = value;
  __syncthreads();
  float result = scratch[0];
  for (int w = 1; w < kWarps; ++w)
    result = fmaxf(result, scratch[w]);
  __syncthreads();
  return result;
}

// psi's code: cvt.rni of x * inverse, saturated to [-127, 127] (numerics::roundToInt8; NaN gives 0).
__device__ __forceinline__ signed char int8_code(float x, float inverse) {
  const int code = __float2int_rn(x * inverse);
  return static_cast<signed char>(code > 127 ? 127 : (code < -127 ? -127 : code));
}

// numerics::symmetricScale(amax, 127): scale amax / 127 and inverse 127 / amax in f32, 0 and 0 for amax 0.
__device__ __forceinline__ void int8_scale(float amax, float &scale, float &inverse) {
  scale = amax / 127.0f;
  inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
}

template <bool kBf16> __device__ __forceinline__ unsigned pack_output(float low, float high) {
  if constexpr (kBf16)
    return pack_bf16x2(low, high);
  else
    return pack_f16x2(low, high);
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory.
__device__ __forceinline__ void copy_tile(void *shared, const void *global, int bytes) {
  for (int chunk = threadIdx.x; chunk < bytes / 16; chunk += kThreads)
    static_cast<uint4 *>(shared)[chunk] = static_cast<const uint4 *>(global)[chunk];
}

// Rows token0.. of a [tokens, head_dim] 16-bit head into a [kBlock, head_dim] tile; zero beyond `tokens`.
template <int kHeadDim>
__device__ __forceinline__ void load_input_tile(unsigned short *shared, const unsigned short *head, int token0,
                                                int tokens) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  for (int chunk = threadIdx.x; chunk < kBlock * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow;
    uint4 value = make_uint4(0u, 0u, 0u, 0u);
    if (token0 + row < tokens)
      value = reinterpret_cast<const uint4 *>(head +
                                              static_cast<long long>(token0 + row) * kHeadDim)[chunk % kChunksPerRow];
    reinterpret_cast<uint4 *>(shared)[chunk] = value;
  }
}

// psi of one 64-token block of a head: one int8 scale for its 64 x head_dim values (zeros beyond `tokens`).
// Writes the codes natural ([token][channel], when `codes` is given) and transposed ([channel][token] per block).
template <class Config>
__device__ void quantize_block(const unsigned short *head, int tokens, int block, signed char *codes,
                               signed char *codes_t, float *scales, float *scratch) {
  constexpr int kHeadDim = Config::kHeadDim;
  const int token0 = block * kBlock;
  float amax = 0.0f;
  for (int e = threadIdx.x; e < kBlock * kHeadDim; e += kThreads) {
    const int t = e / kHeadDim, c = e % kHeadDim;
    if (token0 + t < tokens)
      amax = fmaxf(amax,
                   fabsf(decode_input_element<Config::kBf16>(head[static_cast<long long>(token0 + t) * kHeadDim + c])));
  }
  amax = block_max(amax, scratch);
  float scale, inverse;
  int8_scale(amax, scale, inverse);
  for (int e = threadIdx.x; e < kBlock * kHeadDim; e += kThreads) {
    const int t = e / kHeadDim, c = e % kHeadDim;
    const float x = token0 + t < tokens
                        ? decode_input_element<Config::kBf16>(head[static_cast<long long>(token0 + t) * kHeadDim + c])
                        : 0.0f;
    const signed char code = int8_code(x, inverse);
    if (codes)
      codes[static_cast<long long>(token0 + t) * kHeadDim + c] = code;
    codes_t[static_cast<long long>(block) * kBlock * kHeadDim + c * kBlock + t] = code;
  }
  if (threadIdx.x == 0)
    scales[block] = scale;
}

// ---- the four kernels --------------------------------------------------------------------------------------------
template <class Config> __device__ void preprocess_q(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim;
  __shared__ float scratch[kWarps];
  const int block = blockIdx.x, blocks = (p.tokens_q + kBlock - 1) / kBlock;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_q + blockIdx.y;
  const long long head_elements = head * p.tokens_q * kHeadDim, head_codes = head * blocks * kBlock * kHeadDim;
  const auto *q = static_cast<const unsigned short *>(p.q) + head_elements;
  const auto *d_o = static_cast<const unsigned short *>(p.d_o) + head_elements;
  const auto *o = static_cast<const unsigned short *>(p.o) + head_elements;
  // {s_Q, Q^_i} = psi(Q_i), {s_dO, dO^_i} = psi(dO_i) (Algorithm 3, line 6)
  quantize_block<Config>(q, p.tokens_q, block, p.q_codes + head_codes, p.q_codes_t + head_codes,
                         p.q_scales + head * blocks, scratch);
  quantize_block<Config>(d_o, p.tokens_q, block, nullptr, p.do_codes_t + head_codes, p.do_scales + head * blocks,
                         scratch);
  // D_i = rowsum(dO_i o O_i) (line 2), one warp per row; dQ's f32 sum starts at zero
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int row = warp; row < kBlock; row += kWarps) {
    const int token = block * kBlock + row;
    if (token >= p.tokens_q)
      break;
    float sum = 0.0f;
    for (int c = lane; c < kHeadDim; c += 32)
      sum += decode_input_element<Config::kBf16>(d_o[static_cast<long long>(token) * kHeadDim + c]) *
             decode_input_element<Config::kBf16>(o[static_cast<long long>(token) * kHeadDim + c]);
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0)
      p.delta[head * p.tokens_q + token] = sum;
    for (int c = lane; c < kHeadDim; c += 32)
      p.dq_accum[(head * p.tokens_q + token) * kHeadDim + c] = 0.0f;
  }
}

template <class Config> __device__ void preprocess_k(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim;
  __shared__ float scratch[kWarps];
  const int blocks = (p.tokens_kv + kBlock - 1) / kBlock;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const long long head_codes = head * blocks * kBlock * kHeadDim;
  const auto *k = static_cast<const unsigned short *>(p.k) + head * p.tokens_kv * kHeadDim;
  // {s_K, K^_j} = psi(K_j)
  quantize_block<Config>(k, p.tokens_kv, blockIdx.x, p.k_codes + head_codes, p.k_codes_t + head_codes,
                         p.k_scales + head * blocks, scratch);
}

template <class Config> __device__ void backward_main(const SageBackwardParams &p, unsigned char *shared) {
  constexpr int kHeadDim = Config::kHeadDim, kChannelTiles = kHeadDim / 8, kTileBytes = kBlock * kHeadDim;
  signed char *k_tile = reinterpret_cast<signed char *>(shared); // [key][channel]
  signed char *k_tile_t = k_tile + kTileBytes;                   // [channel][key]
  auto *v_tile = reinterpret_cast<unsigned short *>(k_tile_t + kTileBytes);
  signed char *q_tile = reinterpret_cast<signed char *>(v_tile + kTileBytes);
  signed char *q_tile_t = q_tile + kTileBytes;
  auto *do_tile = reinterpret_cast<unsigned short *>(q_tile_t + kTileBytes);
  signed char *do_tile_t = reinterpret_cast<signed char *>(do_tile + kTileBytes);
  signed char *p_t_codes = do_tile_t + kTileBytes;       // [key][query]
  signed char *ds_t_codes = p_t_codes + kBlock * kBlock; // [key][query]
  signed char *ds_codes = ds_t_codes + kBlock * kBlock;  // [query][key]
  float *lse_log2 = reinterpret_cast<float *>(ds_codes + kBlock * kBlock);
  float *delta = lse_log2 + kBlock;
  float *scratch = delta + kBlock; // 2 x kWarps

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int kv_block = blockIdx.x, key0 = kv_block * kBlock;
  const int kv_blocks = (p.tokens_kv + kBlock - 1) / kBlock, q_blocks = (p.tokens_q + kBlock - 1) / kBlock;
  const long long kv_head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const long long kv_codes = (kv_head * kv_blocks + kv_block) * kTileBytes;
  copy_tile(k_tile, p.k_codes + kv_codes, kTileBytes);
  copy_tile(k_tile_t, p.k_codes_t + kv_codes, kTileBytes);
  load_input_tile<kHeadDim>(v_tile, static_cast<const unsigned short *>(p.v) + kv_head * p.tokens_kv * kHeadDim, key0,
                            p.tokens_kv);
  const float k_scale = p.k_scales[kv_head * kv_blocks + kv_block];
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int causal_offset = p.tokens_kv - p.tokens_q; // key j is visible to query i iff j <= i + offset
  int first_q_block = 0;
  if constexpr (Config::kCausal) { // the first Q tile with a visible key of this KV tile
    const int last_blind = key0 - causal_offset - kBlock;
    first_q_block = last_blind >= 0 ? last_blind / kBlock + 1 : 0;
  }

  float dk[kChannelTiles][4] = {}, dv[kChannelTiles][4] = {};
  const int group = p.heads_q / p.heads_kv;
  for (int h = static_cast<int>(blockIdx.y) * group; h < (static_cast<int>(blockIdx.y) + 1) * group; ++h) {
    const long long q_head = static_cast<long long>(blockIdx.z) * p.heads_q + h;
    for (int q_block = first_q_block; q_block < q_blocks; ++q_block) {
      const int query0 = q_block * kBlock;
      const long long q_codes = (q_head * q_blocks + q_block) * kTileBytes;
      __syncthreads(); // every warp is done with the previous Q tile
      copy_tile(q_tile, p.q_codes + q_codes, kTileBytes);
      copy_tile(q_tile_t, p.q_codes_t + q_codes, kTileBytes);
      copy_tile(do_tile_t, p.do_codes_t + q_codes, kTileBytes);
      load_input_tile<kHeadDim>(do_tile, static_cast<const unsigned short *>(p.d_o) + q_head * p.tokens_q * kHeadDim,
                                query0, p.tokens_q);
      if (threadIdx.x < kBlock) {
        const int query = query0 + threadIdx.x;
        lse_log2[threadIdx.x] = query < p.tokens_q ? p.lse[q_head * p.tokens_q + query] * kLog2e : negative_infinity();
        delta[threadIdx.x] = query < p.tokens_q ? p.delta[q_head * p.tokens_q + query] : 0.0f;
      }
      const float q_scale = p.q_scales[q_head * q_blocks + q_block];
      const float do_scale = p.do_scales[q_head * q_blocks + q_block];
      __syncthreads();

      // S^T = K^ Q^^T x s_K s_Q; P^T = exp(S^T / sqrt(d) - L); dP^T = V dO^T (16-bit); dS^T = P^T o (dP^T - D)
      float p_t[8][4], ds_t[8][4];
      float p_max = 0.0f, ds_max = 0.0f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        int s[4] = {0, 0, 0, 0};
        float dp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 32) {
          unsigned a[4], b[2];
          load_a_s8(a, k_tile, kHeadDim, warp * 16, k0);
          load_b_s8(b, q_tile, kHeadDim, n * 8, k0);
          mma_s8(s, a, b);
        }
#pragma unroll
        for (int k0 = 0; k0 < kHeadDim; k0 += 16) {
          unsigned a[4], b[2];
          load_a_16bit(a, v_tile, kHeadDim, warp * 16, k0);
          load_b_16bit(b, do_tile, kHeadDim, n * 8, k0);
          mma_16bit<Config::kBf16>(dp, a, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = key0 + warp * 16 + g + (e >= 2 ? 8 : 0), row = n * 8 + 2 * t + (e & 1);
          const int query = query0 + row;
          const float lse = lse_log2[row];
          bool visible = key < p.tokens_kv && query < p.tokens_q && lse != negative_infinity();
          if constexpr (Config::kCausal)
            visible = visible && key <= query + causal_offset;
          const float score = static_cast<float>(s[e]) * q_scale * k_scale;
          const float probability = visible ? fast_exp2(score * scale_log2 - lse) : 0.0f;
          p_t[n][e] = probability;
          ds_t[n][e] = probability * (dp[e] - delta[row]);
          p_max = fmaxf(p_max, probability);
          ds_max = fmaxf(ds_max, fabsf(ds_t[n][e]));
        }
      }
      // {s_P, P^}, {s_dS, dS^}: one int8 scale per 64 x 64 tile (lines 6 and 9)
      float p_scale, p_inverse, ds_scale, ds_inverse;
      int8_scale(block_max(p_max, scratch), p_scale, p_inverse);
      int8_scale(block_max(ds_max, scratch + kWarps), ds_scale, ds_inverse);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = warp * 16 + g + (e >= 2 ? 8 : 0), row = n * 8 + 2 * t + (e & 1);
          p_t_codes[key * kBlock + row] = int8_code(p_t[n][e], p_inverse);
          const signed char ds_code = int8_code(ds_t[n][e], ds_inverse);
          ds_t_codes[key * kBlock + row] = ds_code;
          ds_codes[row * kBlock + key] = ds_code;
        }
      __syncthreads();

      // dV_j += P^^T dO^_i, dK_j += dS^^T Q^_i (this warp's 16 keys); dQ_i += dS^ K^_j (this warp's 16 queries)
      const float dv_scale = p_scale * do_scale, dk_scale = ds_scale * q_scale;
      const float dq_scale = ds_scale * k_scale * p.softmax_scale;
#pragma unroll
      for (int nc = 0; nc < kChannelTiles; ++nc) {
        int acc_v[4] = {0, 0, 0, 0}, acc_k[4] = {0, 0, 0, 0}, acc_q[4] = {0, 0, 0, 0};
#pragma unroll
        for (int k0 = 0; k0 < kBlock; k0 += 32) {
          unsigned a[4], b[2];
          load_a_s8(a, p_t_codes, kBlock, warp * 16, k0);
          load_b_s8(b, do_tile_t, kBlock, nc * 8, k0);
          mma_s8(acc_v, a, b);
          load_a_s8(a, ds_t_codes, kBlock, warp * 16, k0);
          load_b_s8(b, q_tile_t, kBlock, nc * 8, k0);
          mma_s8(acc_k, a, b);
          load_a_s8(a, ds_codes, kBlock, warp * 16, k0);
          load_b_s8(b, k_tile_t, kBlock, nc * 8, k0);
          mma_s8(acc_q, a, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dv[nc][e] += static_cast<float>(acc_v[e]) * dv_scale;
          dk[nc][e] += static_cast<float>(acc_k[e]) * dk_scale;
          const int query = query0 + warp * 16 + g + (e >= 2 ? 8 : 0), channel = nc * 8 + 2 * t + (e & 1);
          if (query < p.tokens_q)
            atomicAdd(p.dq_accum + (q_head * p.tokens_q + query) * kHeadDim + channel,
                      static_cast<float>(acc_q[e]) * dq_scale);
        }
      }
    }
  }

  // dK_j (x 1/sqrt(d): dS is the gradient of S / sqrt(d)) and dV_j in the input type
  auto *d_k = static_cast<unsigned *>(p.d_k);
  auto *d_v = static_cast<unsigned *>(p.d_v);
#pragma unroll
  for (int nc = 0; nc < kChannelTiles; ++nc)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = key0 + warp * 16 + g + 8 * half, channel = nc * 8 + 2 * t;
      if (key >= p.tokens_kv)
        continue;
      const long long pair = ((kv_head * p.tokens_kv + key) * kHeadDim + channel) / 2;
      d_k[pair] =
          pack_output<Config::kBf16>(dk[nc][2 * half] * p.softmax_scale, dk[nc][2 * half + 1] * p.softmax_scale);
      d_v[pair] = pack_output<Config::kBf16>(dv[nc][2 * half], dv[nc][2 * half + 1]);
    }
}

template <class Config> __device__ void write_dq(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_q + blockIdx.y;
  const int token0 = blockIdx.x * kBlock;
  auto *d_q = static_cast<unsigned *>(p.d_q);
  for (int e = threadIdx.x; e < kBlock * kHeadDim / 2; e += kThreads) {
    const int token = token0 + e / (kHeadDim / 2), channel = 2 * (e % (kHeadDim / 2));
    if (token >= p.tokens_q)
      break;
    const long long index = (head * p.tokens_q + token) * kHeadDim + channel;
    d_q[index / 2] = pack_output<Config::kBf16>(p.dq_accum[index], p.dq_accum[index + 1]);
  }
}

} // namespace sage::device::sm80::backward
