// SageBwd on mma.sync (sm_80 and later; issue 12): SageAttention3's Algorithm 3 in five launches (four without K
// smoothing).
//
//   k_sums        (slice, head_kv, batch; K smoothing, issue 25): K's column sums over at most 8 slices of each KV
//                 head's tokens, which the preprocess kernels add up to mean(K).
//   preprocess_q  (Q block, head_q, batch): psi(Q_i) and psi(dO_i), int8 with one scale per 64-token block, in the
//                 natural and the transposed tile layout; per row L log2(e) and D_i = rowsum(dO_i o O_i) (the row
//                 stats, whole 64-row blocks: rows beyond the end get P = 0 without a bounds check); dq_accum zeroed.
//                 With K smoothing L is the forward's LSE minus q_i . mean(K) / sqrt(d), the LSE of S_s = Q K_s^T.
//   preprocess_k  (KV block, head_kv, batch): psi(K_j), natural and transposed; K_j - mean(K) with K smoothing, so
//                 that S^T and dQ below multiply the smoothed K (dQ = dS K_s = dS K: dS's rows sum to zero).
//   main          (KV block, head_kv, batch): FlashAttention-2's backward order. K_j, V_j stay in shared memory; for
//                 each query head of the GQA group and each visible Q tile i, 4 warps of 16 keys each compute
//                 S^T = K^ Q^^T (int8), P^T = exp2(S^T * scale * log2 e - L * log2 e), dP^T = V dO^T (f16/bf16, kept
//                 in 16 bits as Algorithm 3 line 8 says), dS^T = P^T o (dP^T - D); P and dS get one int8 scale per
//                 64 x 64 tile (a block reduction; with Config::kKeyScales P and dS^T one per key, dS for dQ per
//                 tile); then dV_j += P^T dO^ and dK_j += dS^T Q^ in registers (f32, summed over the group's query
//                 heads without atomics) and dQ_i += dS K^ by f32 atomics.
//   write_dq      (Q block, head_q, batch): dq_accum -> dQ in the input type.
// With the randomized Hadamard rotation (issue 25, Config::kRotate; backward_rotation.cuh) the preprocess quantizes
// Q R_Q and K R_K, `main` computes as before (S is unchanged; dQ and dK come out in the rotated basis) except that its
// epilogue rotates dK back through shared memory, and write_dq rotates dQ back.
//
// Why atomics for dQ: a CTA owns one KV tile and visits every Q tile, so dQ_i gets one partial sum per KV tile.
// Keeping dQ_i in registers would need the transposed loop order (a second pass recomputing S, P and dS per Q tile,
// i.e. twice the int8 Q.K^T and the 16-bit dO.V^T); f32 atomics into an L2-resident buffer cost one reduction per
// element per KV tile and keep one pass. The price: dQ's summation order varies between runs (last-bit noise).
//
// Operands reach the mma fragments by ldmatrix (PTX ISA, "Matrix Fragments for mma.m16n8k32" and "m16n8k16"): an
// 8 x 8 b16 matrix is 8 rows of 16 bytes, and lane l receives bytes 4(l % 4).. of row l / 4, which is the fragment of
// 16-bit operands (2 elements) and of 8-bit ones (4 elements) alike. Every operand is stored with its reduction axis
// contiguous, which is why the prologue writes Q, K and dO codes transposed as well: 8-bit operands have no
// ldmatrix.trans. Shared-memory rows are padded by 16 bytes (kPad): rows of 64, 128 or 256 bytes would put the 8
// rows of an 8 x 8 matrix in the same 4 banks (an 8-way conflict); with the pad they cover all 32 banks.
//
// Tile loads are cp.async, overlapped without extra buffers: the step of Q tile i computes S and dP (phase 1, which
// reads Q^, dO, L, D) and then dV, dK, dQ (phase 2, which reads Q^^T, dO^^T and the P/dS codes). Q^^T and dO^^T of
// tile i are fetched while phase 1 of tile i runs, and Q^, dO, L, D of tile i + 1 while phase 2 of tile i runs.
// Three barriers per step: phase 1's loads landed (which also ends the previous phase 2), the block maxima of P and
// dS, and the codes written.
//
// Most of a step's instructions are not mma (ncu, H100, N = 4096: the mma were 7% of the issued instructions): the
// element-wise softmax gradient, the int32 -> f32 rescaling of each int8 product and the dQ reductions. So the
// masks are applied only on tiles that cross the sequence's end or the causal diagonal, rows beyond tokens_q need
// no check (their stats give P = 0 and their dQ rows are padding), and the dQ reductions are branch-free.
#pragma once

#include "sage/device/sm80/backward_prepare.cuh"
#include "sage/device/sm90/common.cuh"

namespace sage::device::sm80::backward {

using sm90::fast_exp2;

// `main` owns Config::kKeys keys (64 or 128: one or two K blocks, as shared memory allows) with one warp per 16.
template <class Config> constexpr int kMainWarps = Config::kKeys / 16;
template <class Config> constexpr int kMainThreads = 32 * kMainWarps<Config>;

constexpr int kPad = 16; // bytes after each shared-memory row (see the top of this file)

// Row strides in bytes of `main`'s shared tiles: [64][d] int8, [64][d] 16-bit, and [d][64] / [64][64] int8.
template <int kHeadDim> constexpr int kCodeRowBytes = kHeadDim + kPad;
template <int kHeadDim> constexpr int kInputRowBytes = 2 * kHeadDim + kPad;
constexpr int kTokenRowBytes = kBlock + kPad;

// Shared memory of `main` (kKeys keys, a 64-query tile): K^ ([kKeys][d] int8), Q^ ([64][d] int8), K^^T (one [d][64]
// int8 tile per K block), Q^^T, dO^^T ([d][64] int8), V ([kKeys][d] 16-bit), dO ([64][d] 16-bit), the P^T and dS^T
// codes ([kKeys][64] int8), the dS codes ([64][kKeys] int8), the row stats {L log2(e), D} of 64 rows, 2 x 2 x
// kMainWarps floats of reduction scratch (two buffers, alternating by step, so that a reduction needs one barrier);
// with Config::kQueryScales each warp's |dS| maxima of the 64 queries ([kMainWarps][64] floats).
template <class Config> constexpr int kQueryMaximaFloats = Config::kQueryScales ? kMainWarps<Config> *kBlock : 0;
template <class Config>
constexpr int kMainSharedBytes = (Config::kKeys + kBlock) * kCodeRowBytes<Config::kHeadDim> +
                                 (Config::kKeys / kBlock + 2) * Config::kHeadDim *kTokenRowBytes +
                                 (Config::kKeys + kBlock) * kInputRowBytes<Config::kHeadDim> +
                                 2 * Config::kKeys *kTokenRowBytes + kBlock *(Config::kKeys + kPad) +
                                 (2 * kBlock + 4 * kMainWarps<Config> + kQueryMaximaFloats<Config>)*4;

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

__device__ __forceinline__ unsigned shared_address(const void *pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// A (16 rows x 32 bytes, row-major: 16 x 32 int8 or 16 x 16 16-bit) at rows row0.. and bytes column0.. of a tile
// with `stride` bytes per row. Lanes 8m..8m+7 address matrix m: rows +8 for m odd, bytes +16 for m >= 2.
__device__ __forceinline__ void load_a(unsigned (&a)[4], const unsigned char *tile, int stride, int row0, int column0) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
  ldmatrix_x4(a, shared_address(tile + (row0 + (lane & 7) + (m & 1) * 8) * stride + column0 + (m >> 1) * 16));
}

// B of two n-tiles (columns n0.. and n0 + 8.., stored as rows with the reduction axis contiguous) over 32 bytes
// from column0: b0 for n0, b1 for n0 + 8.
__device__ __forceinline__ void load_b_pair(unsigned (&b0)[2], unsigned (&b1)[2], const unsigned char *tile, int stride,
                                            int n0, int column0) {
  const int lane = threadIdx.x & 31, m = lane >> 3;
  unsigned r[4];
  ldmatrix_x4(r, shared_address(tile + (n0 + (lane & 7) + (m >> 1) * 8) * stride + column0 + (m & 1) * 16));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// B of one n-tile over two k-steps of 32 bytes (64 bytes from column 0): b0 for bytes 0..31, b1 for 32..63.
__device__ __forceinline__ void load_b_two_steps(unsigned (&b0)[2], unsigned (&b1)[2], const unsigned char *tile,
                                                 int stride, int n0) {
  const int lane = threadIdx.x & 31;
  unsigned r[4];
  ldmatrix_x4(r, shared_address(tile + (n0 + (lane & 7)) * stride + (lane >> 3) * 16));
  b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}

// ---- cp.async ----------------------------------------------------------------------------------------------------
// 16 bytes global -> shared; `valid` false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void copy16_async(void *shared, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global -> shared (through L1: rows of L and D are 4-byte words); `valid` false writes a zero word.
__device__ __forceinline__ void copy4_async(void *shared, const void *global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most `kPending` of this thread's committed copy groups are still in flight.
template <int kPending> __device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Rows row0 .. row0 + kRows - 1 of a global matrix of `rows` rows of kRowBytes (a multiple of 16) into shared rows
// kStride bytes apart; rows at or beyond `rows` become zeros (and read nothing: their source is the matrix's start).
template <int kCopyThreads, int kRows, int kRowBytes, int kStride>
__device__ __forceinline__ void copy_rows_async(unsigned char *shared, const void *matrix, long long row0,
                                                long long rows) {
  constexpr int kChunksPerRow = kRowBytes / 16, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kCopyThreads == 0, "every thread copies the same number of chunks");
  const auto *base = static_cast<const unsigned char *>(matrix);
  const auto *first = base + row0 * kRowBytes;
  const long long valid_rows = rows - row0;
#pragma unroll
  for (int i = 0; i < kChunks / kCopyThreads; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * kCopyThreads;
    const int row = chunk / kChunksPerRow, column = (chunk % kChunksPerRow) * 16;
    const bool valid = row < valid_rows;
    copy16_async(shared + row * kStride + column, valid ? first + chunk * 16 : base, valid);
  }
}

// A whole tile of kRows x kRowBytes contiguous bytes (a workspace tile) into shared rows kStride bytes apart; zeros
// where `valid` is false (a K block beyond the sequence's end: nothing is read).
template <int kCopyThreads, int kRows, int kRowBytes, int kStride>
__device__ __forceinline__ void copy_tile_async(unsigned char *shared, const void *tile, bool valid = true) {
  constexpr int kChunksPerRow = kRowBytes / 16, kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kCopyThreads == 0, "every thread copies the same number of chunks");
  const auto *base = static_cast<const unsigned char *>(tile);
#pragma unroll
  for (int i = 0; i < kChunks / kCopyThreads; ++i) {
    const int chunk = static_cast<int>(threadIdx.x) + i * kCopyThreads;
    const int row = chunk / kChunksPerRow, column = (chunk % kChunksPerRow) * 16;
    copy16_async(shared + row * kStride + column, base + (valid ? chunk * 16 : 0), valid);
  }
}

// ---- helpers -----------------------------------------------------------------------------------------------------
// The maxima of `first` and `second` over each group of 4 warps (a 64 x 64 tile of `main`: kWarpCount / 4 groups)
// in one exchange and one barrier; maxima[group] = {first, second} of each group. `scratch`: 2 x kWarpCount floats,
// which the caller must not pass again before another barrier has passed (it alternates two buffers).
template <int kWarpCount>
__device__ __forceinline__ void tile_max_pairs(float first, float second, float *scratch,
                                               float2 (&maxima)[kWarpCount / 4]) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    first = fmaxf(first, __shfl_xor_sync(0xffffffffu, first, offset));
    second = fmaxf(second, __shfl_xor_sync(0xffffffffu, second, offset));
  }
  if ((threadIdx.x & 31) == 0) {
    scratch[threadIdx.x >> 5] = first;
    scratch[kWarpCount + (threadIdx.x >> 5)] = second;
  }
  __syncthreads();
#pragma unroll
  for (int group = 0; group < kWarpCount / 4; ++group) {
    maxima[group] = make_float2(scratch[4 * group], scratch[kWarpCount + 4 * group]);
#pragma unroll
    for (int w = 1; w < 4; ++w) {
      maxima[group].x = fmaxf(maxima[group].x, scratch[4 * group + w]);
      maxima[group].y = fmaxf(maxima[group].y, scratch[kWarpCount + 4 * group + w]);
    }
  }
}

// Column maxima of a warp's 16 x 64 accumulator tile (mma.sync's and wgmma's layout: a thread holds columns 8n + 2t
// and 8n + 2t + 1 of its two rows): `values[2n + c]` is this thread's maximum of column 8n + 2t + c; lane l returns the
// warp's maxima of columns 2l and 2l + 1. A reduce-scatter over the 8 lanes of a quad position: each step exchanges
// the half of the values the partner keeps (8 + 4 + 2 shuffles instead of 16 x 3 for a full reduction of each).
template <int kHalf> __device__ __forceinline__ void column_maxima_step(float (&values)[16]) {
  const bool upper = (threadIdx.x & (2 * kHalf)) != 0; // this lane keeps values kHalf .. 2 kHalf - 1
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float low = values[i], high = values[kHalf + i];
    values[i] = fmaxf(upper ? high : low, __shfl_xor_sync(0xffffffffu, upper ? low : high, 2 * kHalf));
  }
}

__device__ __forceinline__ float2 column_maxima(float (&values)[16]) {
  // lane bits 4, 3, 2 (g's bits 2, 1, 0) pick value bits 3, 2, 1 (steps of constant trip counts: fully unrolled, the
  // values stay in registers)
  column_maxima_step<8>(values);
  column_maxima_step<4>(values);
  column_maxima_step<2>(values);
  return make_float2(values[0], values[1]);
}

// The value of column 8n + 2t + c (c = 0: .x, 1: .y) of this thread (t = lane % 4) from `per_column`, which lane l
// holds for columns 2l and 2l + 1 (column_maxima's order).
__device__ __forceinline__ float2 of_columns(float2 per_column, int n) {
  const int source = 4 * n + (threadIdx.x & 3);
  return make_float2(__shfl_sync(0xffffffffu, per_column.x, source), __shfl_sync(0xffffffffu, per_column.y, source));
}

// The |dS| maximum of `query` over K block `block`'s 4 warps (16 keys each), from their column maxima in
// query_maxima ([warp][64 queries], warps 4 block .. 4 block + 3).
__device__ __forceinline__ float block_query_max(const float *query_maxima, int block, int query) {
  const float *first = query_maxima + 4 * block * kBlock + query;
  return fmaxf(fmaxf(first[0], first[kBlock]), fmaxf(first[2 * kBlock], first[3 * kBlock]));
}

// ... of the queries `query` (even) and query + 1: 8-byte loads.
__device__ __forceinline__ float2 block_query_max_pair(const float *query_maxima, int block, int query) {
  const float2 *first = reinterpret_cast<const float2 *>(query_maxima + 4 * block * kBlock + query);
  float2 result = first[0];
#pragma unroll
  for (int w = 1; w < 4; ++w)
    result = make_float2(fmaxf(result.x, first[w * kBlock / 2].x), fmaxf(result.y, first[w * kBlock / 2].y));
  return result;
}

// ---- the main kernel ------------------------------------------------------------------------------------------------
// dQ's f32 sum in global memory (8-byte aligned `address`): one reduction per pair of channels on sm_90 (a vector
// red halves the L2 atomic traffic), two atomics before it.
__device__ __forceinline__ void add_pair(float *address, float low, float high) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(low), "f"(high) : "memory");
#else
  atomicAdd(address, low);
  atomicAdd(address + 1, high);
#endif
}

// P^T = exp2(S^T log2(e) / sqrt(d) - L log2(e)) and dS^T = P^T o (dP^T - D) (in place of dP^T) of this thread's
// elements, with their maxima per key row with Config::kKeyScales (index 0: key_base, 1: key_base + 8), else in [0].
// kCheckVisibility: test each key against the KV sequence's end and (causal) the diagonal; tiles inside both skip it
// (rows beyond tokens_q need no test: their stats give P = 0). key_base: the key of the thread's first element row;
// query_base: the query of its first column.
template <class Config, bool kCheckVisibility>
__device__ __forceinline__ void softmax_gradient(const int (&s)[8][4], float (&dp)[8][4], float (&p_t)[8][4],
                                                 float (&p_max)[2], float (&ds_max)[2], const float *row_stats,
                                                 float score_scale, int key_base, int query_base, int tokens_kv,
                                                 int causal_offset) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    // rows n * 8 + 2t and n * 8 + 2t + 1: {L log2(e), D} of each
    const float4 stats = *reinterpret_cast<const float4 *>(row_stats + 2 * (n * 8 + 2 * t));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float lse_log2 = e & 1 ? stats.z : stats.x, delta = e & 1 ? stats.w : stats.y;
      float probability = fast_exp2(fmaf(static_cast<float>(s[n][e]), score_scale, -lse_log2));
      if constexpr (kCheckVisibility) {
        const int key = key_base + (e >= 2 ? 8 : 0);
        bool visible = key < tokens_kv;
        if constexpr (Config::kCausal)
          visible = visible && key <= query_base + n * 8 + (e & 1) + causal_offset;
        probability = visible ? probability : 0.0f;
      }
      p_t[n][e] = probability;
      dp[n][e] = probability * (dp[n][e] - delta);
      const int key_row = Config::kKeyScales ? e >> 1 : 0; // per key row only where the scales are per key
      p_max[key_row] = fmaxf(p_max[key_row], probability);
      ds_max[key_row] = fmaxf(ds_max[key_row], fabsf(dp[n][e]));
    }
  }
}

// values[block] for a warp-uniform block of at most two: selects instead of a dynamically indexed (local memory)
// array.
template <class T, int kCount> __device__ __forceinline__ T of_block(const T (&values)[kCount], int block) {
  static_assert(kCount == 1 || kCount == 2, "a tile has one or two K blocks");
  return kCount == 1 || block == 0 ? values[0] : values[kCount - 1];
}

// Two int8 codes as one 16-bit store: `low` at the lower address.
__device__ __forceinline__ unsigned short code_pair(signed char low, signed char high) {
  return static_cast<unsigned short>(static_cast<unsigned char>(low) | (static_cast<unsigned char>(high) << 8));
}

// The Q tiles that the CTA of a KV tile (keys from key0) visits, in order: every visible Q tile of every query head of
// its KV head's GQA group, head by head (causal: from the first Q tile with a visible key of the tile).
struct StepWalk {
  int first_q_block = 0, tiles_per_head = 0, first_head = 0, steps = 0;
  __device__ long long q_head(const SageBackwardParams &p, int step) const {
    return static_cast<long long>(blockIdx.z) * p.heads_q + first_head + step / tiles_per_head;
  }
  __device__ int q_block(int step) const { return first_q_block + step % tiles_per_head; }
};

template <bool kCausal> __device__ StepWalk step_walk(const SageBackwardParams &p, int key0, int q_blocks) {
  StepWalk walk;
  if constexpr (kCausal) {
    const int last_blind = key0 - (p.tokens_kv - p.tokens_q) - kBlock; // the last Q tile that sees none of its keys
    walk.first_q_block = last_blind >= 0 ? last_blind / kBlock + 1 : 0;
  }
  const int group = p.heads_q / p.heads_kv;
  walk.first_head = static_cast<int>(blockIdx.y) * group;
  walk.tiles_per_head = q_blocks - walk.first_q_block;
  walk.steps = walk.tiles_per_head > 0 ? group * walk.tiles_per_head : 0;
  return walk;
}

template <class Config> __device__ void backward_main(const SageBackwardParams &p, unsigned char *shared) {
  constexpr int kHeadDim = Config::kHeadDim, kChannelTiles = kHeadDim / 8, kTileBytes = kBlock * kHeadDim;
  constexpr int kKeys = Config::kKeys, kKeyBlocks = kKeys / kBlock, kWarpCount = kMainWarps<Config>;
  constexpr int kThreadCount = kMainThreads<Config>;
  constexpr int kCodeRow = kCodeRowBytes<kHeadDim>, kInputRow = kInputRowBytes<kHeadDim>;
  constexpr int kKeyRowBytes = kKeys + kPad;                                      // a row of the dS codes
  unsigned char *k_tile = shared;                                                 // [key][channel] int8
  unsigned char *q_tile = k_tile + kKeys * kCodeRow;                              // [query][channel] int8
  unsigned char *k_tiles_t = q_tile + kBlock * kCodeRow;                          // per K block: [channel][key] int8
  unsigned char *q_tile_t = k_tiles_t + kKeyBlocks * kHeadDim * kTokenRowBytes;   // [channel][query] int8
  unsigned char *do_tile_t = q_tile_t + kHeadDim * kTokenRowBytes;                // [channel][query] int8
  unsigned char *v_tile = do_tile_t + kHeadDim * kTokenRowBytes;                  // [key][channel] 16-bit
  unsigned char *do_tile = v_tile + kKeys * kInputRow;                            // [query][channel] 16-bit
  unsigned char *p_t_codes = do_tile + kBlock * kInputRow;                        // [key][query]
  unsigned char *ds_t_codes = p_t_codes + kKeys * kTokenRowBytes;                 // [key][query]
  unsigned char *ds_codes = ds_t_codes + kKeys * kTokenRowBytes;                  // [query][key]
  float *row_stats = reinterpret_cast<float *>(ds_codes + kBlock * kKeyRowBytes); // [query]{L log2(e), D}
  float *scratch = row_stats + 2 * kBlock;                                        // 2 buffers of 2 x kWarpCount
  float *query_maxima = scratch + 4 * kWarpCount; // kQueryScales: [warp][query] |dS| maxima of the warp's keys

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int key0 = blockIdx.x * kKeys, warp_block = warp / 4; // this warp's K block within the tile
  const int kv_blocks = (p.tokens_kv + kBlock - 1) / kBlock, q_blocks = (p.tokens_q + kBlock - 1) / kBlock;
  const long long padded_q = static_cast<long long>(q_blocks) * kBlock;
  const long long kv_head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const int first_kv_block = blockIdx.x * kKeyBlocks;
  // The K blocks' scales (0 for a block beyond the sequence's end: its keys are masked and its codes zero)
  float k_scales[kKeyBlocks];
#pragma unroll
  for (int b = 0; b < kKeyBlocks; ++b)
    k_scales[b] = first_kv_block + b < kv_blocks ? p.k_scales[kv_head * kv_blocks + first_kv_block + b] : 0.0f;
  const float k_scale = of_block(k_scales, warp_block);
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int causal_offset = p.tokens_kv - p.tokens_q; // key j is visible to query i iff j <= i + offset
  const bool partial_kv_tile = key0 + kKeys > p.tokens_kv;
  const StepWalk walk = step_walk<Config::kCausal>(p, key0, q_blocks);
  const int steps = walk.steps;
  const auto *d_o_input = static_cast<const unsigned short *>(p.d_o);

  // Starts a step's phase-1 loads as one cp.async group: Q^, dO and the rows' stats.
  auto issue_phase1 = [&](int step) {
    const long long q_head = walk.q_head(p, step);
    const int q_block = walk.q_block(step);
    copy_tile_async<kThreadCount, kBlock, kHeadDim, kCodeRow>(q_tile,
                                                              p.q_codes + (q_head * q_blocks + q_block) * kTileBytes);
    copy_rows_async<kThreadCount, kBlock, 2 * kHeadDim, kInputRow>(do_tile, d_o_input + q_head * p.tokens_q * kHeadDim,
                                                                   q_block * kBlock, p.tokens_q);
    constexpr int kStatChunks = kBlock * 2 * 4 / 16;
    if (threadIdx.x < kStatChunks)
      copy16_async(row_stats + 4 * threadIdx.x,
                   p.row_stats + 2 * (q_head * padded_q + q_block * kBlock) + 4 * threadIdx.x, true);
    commit_copies();
  };

  if (steps > 0) { // K^, K^^T, V of this KV tile join step 0's phase-1 group
    const long long k_codes = (kv_head * kv_blocks + first_kv_block) * kTileBytes;
    copy_rows_async<kThreadCount, kKeys, kHeadDim, kCodeRow>(
        k_tile, p.k_codes + k_codes, 0, static_cast<long long>(kv_blocks - first_kv_block) * kBlock);
#pragma unroll
    for (int b = 0; b < kKeyBlocks; ++b)
      copy_tile_async<kThreadCount, kHeadDim, kBlock, kTokenRowBytes>(k_tiles_t + b * kHeadDim * kTokenRowBytes,
                                                                      p.k_codes_t + k_codes + b * kTileBytes,
                                                                      first_kv_block + b < kv_blocks);
    copy_rows_async<kThreadCount, kKeys, 2 * kHeadDim, kInputRow>(
        v_tile, static_cast<const unsigned short *>(p.v) + kv_head * p.tokens_kv * kHeadDim, key0, p.tokens_kv);
    issue_phase1(0);
  }

  float dk[kChannelTiles][4] = {}, dv[kChannelTiles][4] = {};
  for (int step = 0; step < steps; ++step) {
    const long long q_head = walk.q_head(p, step);
    const int q_block = walk.q_block(step), query0 = q_block * kBlock;
    const long long q_codes = (q_head * q_blocks + q_block) * kTileBytes;
    const float q_scale = p.q_scales[q_head * q_blocks + q_block], do_scale = p.do_scales[q_head * q_blocks + q_block];
    wait_copies<0>(); // this step's phase-1 group
    __syncthreads();  // ... is visible, and every warp is done with the previous step's phase 2
    copy_tile_async<kThreadCount, kHeadDim, kBlock, kTokenRowBytes>(q_tile_t, p.q_codes_t + q_codes);
    copy_tile_async<kThreadCount, kHeadDim, kBlock, kTokenRowBytes>(do_tile_t, p.do_codes_t + q_codes);
    commit_copies();

    // Phase 1. S^T = K^ Q^^T x s_K s_Q (k-steps of 32 channels); dP^T = V dO^T in 16 bits (k-steps of 16 channels).
    // The A fragment (this warp's 16 keys) is loaded once per k-step and used by all 8 query tiles.
    int s[8][4] = {};
    float dp[8][4] = {};
#pragma unroll
    for (int column = 0; column < kHeadDim; column += 32) {
      unsigned a[4];
      load_a(a, k_tile, kCodeRow, warp * 16, column);
#pragma unroll
      for (int n = 0; n < 8; n += 2) {
        unsigned b0[2], b1[2];
        load_b_pair(b0, b1, q_tile, kCodeRow, n * 8, column);
        mma_s8(s[n], a, b0);
        mma_s8(s[n + 1], a, b1);
      }
    }
#pragma unroll
    for (int column = 0; column < 2 * kHeadDim; column += 32) {
      unsigned a[4];
      load_a(a, v_tile, kInputRow, warp * 16, column);
#pragma unroll
      for (int n = 0; n < 8; n += 2) {
        unsigned b0[2], b1[2];
        load_b_pair(b0, b1, do_tile, kInputRow, n * 8, column);
        mma_16bit<Config::kBf16>(dp[n], a, b0);
        mma_16bit<Config::kBf16>(dp[n + 1], a, b1);
      }
    }
    // P^T = exp2(S^T log2(e) / sqrt(d) - L log2(e)); dS^T = P^T o (dP^T - D), in place of dP^T. Only tiles that cross
    // the KV sequence's end or the causal diagonal test each element (rows beyond tokens_q have L log2(e) = +inf).
    const float score_scale = q_scale * k_scale * scale_log2;
    bool masked = partial_kv_tile;
    if constexpr (Config::kCausal)
      masked = masked || key0 + kKeys - 1 > query0 + causal_offset;
    float p_t[8][4];
    float p_max[2] = {0.0f, 0.0f}, ds_max[2] = {0.0f, 0.0f}; // per key row of this thread (g, g + 8)
    const int key_base = key0 + warp * 16 + g, query_base = query0 + 2 * t;
    if (masked)
      softmax_gradient<Config, true>(s, dp, p_t, p_max, ds_max, row_stats, score_scale, key_base, query_base,
                                     p.tokens_kv, causal_offset);
    else
      softmax_gradient<Config, false>(s, dp, p_t, p_max, ds_max, row_stats, score_scale, key_base, query_base,
                                      p.tokens_kv, causal_offset);
    // {s_P, P^}, {s_dS, dS^}: one int8 scale per 64 x 64 tile (lines 6 and 9), i.e. per K block of the tile; with
    // Config::kKeyScales (issue 25) P for dV and dS for dK take one scale per key instead (the maxima of a key row
    // over its 4 threads: 2 shuffles each), which factors out of dV_j and dK_j. With Config::kQueryScales dS for dQ
    // takes one scale per query of the K block: the warps' column maxima meet in shared memory (the tile maxima's
    // barrier), and the scale factors out of dQ_i's row (applied to the product's rows below). With both, the
    // per-key codes need no barrier and are written first, so that P^T's registers are free for the query maxima
    // (ptxas, d 128 on sm_80: 20 bytes fewer spill stores; with per-key scales alone that order spills more).
    constexpr bool kKeyCodesFirst = Config::kKeyScales && Config::kQueryScales;
    float p_scale[2], p_inverse[2], ds_t_scale[2], ds_t_inverse[2], ds_scale = 0.0f, ds_inverse = 0.0f;
    // the P^T and dS^T codes (for dV and dK) of this thread's elements n, rows `half`
    auto write_key_codes = [&](int n, int half) {
      const int key = warp * 16 + g + 8 * half, row = n * 8 + 2 * t; // this thread's query rows row and row + 1
      *reinterpret_cast<unsigned short *>(p_t_codes + key * kTokenRowBytes + row) =
          code_pair(int8_code(p_t[n][2 * half], p_inverse[half]), int8_code(p_t[n][2 * half + 1], p_inverse[half]));
      *reinterpret_cast<unsigned short *>(ds_t_codes + key * kTokenRowBytes + row) =
          code_pair(int8_code(dp[n][2 * half], ds_t_inverse[half]), int8_code(dp[n][2 * half + 1], ds_t_inverse[half]));
    };
    auto key_scales = [&] { // kKeyScales: a key row's maxima over its quad
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float key_p_max = p_max[half], key_ds_max = ds_max[half];
#pragma unroll
        for (int offset = 1; offset < 4; offset <<= 1) {
          key_p_max = fmaxf(key_p_max, __shfl_xor_sync(0xffffffffu, key_p_max, offset));
          key_ds_max = fmaxf(key_ds_max, __shfl_xor_sync(0xffffffffu, key_ds_max, offset));
        }
        int8_scale(key_p_max, p_scale[half], p_inverse[half]);
        int8_scale(key_ds_max, ds_t_scale[half], ds_t_inverse[half]);
      }
    };
    if constexpr (kKeyCodesFirst) {
      key_scales();
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half)
          write_key_codes(n, half);
    }
    if constexpr (Config::kQueryScales) {
      float column_values[16];
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          column_values[2 * n + c] = fmaxf(fabsf(dp[n][c]), fabsf(dp[n][c + 2]));
      reinterpret_cast<float2 *>(query_maxima + warp * kBlock)[lane] = column_maxima(column_values);
    }
    float2 maxima[kKeyBlocks];
    if constexpr (Config::kKeyScales && Config::kQueryScales)
      __syncthreads(); // no tile maxima: the query maxima are visible
    else
      tile_max_pairs<kWarpCount>(fmaxf(p_max[0], p_max[1]), fmaxf(ds_max[0], ds_max[1]),
                                 scratch + (step & 1) * 2 * kWarpCount, maxima);
    if constexpr (!(Config::kKeyScales && Config::kQueryScales)) {
      const float2 own = of_block(maxima, warp_block);
      int8_scale(own.y, ds_scale, ds_inverse);
      if constexpr (Config::kKeyScales)
        key_scales();
      else
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          int8_scale(own.x, p_scale[half], p_inverse[half]);
          ds_t_scale[half] = ds_scale;
          ds_t_inverse[half] = ds_inverse;
        }
    }
    // kQueryScales: the inverse scales of queries 2 lane and 2 lane + 1 of this warp's K block
    float2 query_inverse = make_float2(0.0f, 0.0f);
    if constexpr (Config::kQueryScales) {
      const float2 amax = block_query_max_pair(query_maxima, warp_block, 2 * lane);
      float unused_scale;
      int8_scale(amax.x, unused_scale, query_inverse.x);
      int8_scale(amax.y, unused_scale, query_inverse.y);
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      // dS for dQ: the tile's inverse scale, or (kQueryScales) those of queries n * 8 + 2t and n * 8 + 2t + 1
      const float2 dq_inverse =
          Config::kQueryScales ? of_columns(query_inverse, n) : make_float2(ds_inverse, ds_inverse);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if constexpr (!kKeyCodesFirst)
          write_key_codes(n, half); // per tile, dS^T's codes are dS's (the same scale)
        const int key = warp * 16 + g + 8 * half, row = n * 8 + 2 * t;
        ds_codes[row * kKeyRowBytes + key] = static_cast<unsigned char>(int8_code(dp[n][2 * half], dq_inverse.x));
        ds_codes[(row + 1) * kKeyRowBytes + key] =
            static_cast<unsigned char>(int8_code(dp[n][2 * half + 1], dq_inverse.y));
      }
    }
    wait_copies<0>(); // Q^^T and dO^^T
    __syncthreads();  // the codes, Q^^T and dO^^T are visible; every warp is done with Q^, dO and the row stats
    if (step + 1 < steps)
      issue_phase1(step + 1); // lands while phase 2 runs

    // Phase 2. dV_j += P^^T dO^_i, dK_j += dS^^T Q^_i (this warp's 16 keys).
    // The A fragments (2 k-steps of 32 tokens each) serve every channel tile.
    // index: this thread's key row (g, g + 8), the accumulator elements e / 2
    const float dv_scale[2] = {p_scale[0] * do_scale,
                               Config::kKeyScales ? p_scale[1] * do_scale : p_scale[0] * do_scale};
    const float dk_scale[2] = {ds_t_scale[0] * q_scale,
                               Config::kKeyScales ? ds_t_scale[1] * q_scale : ds_t_scale[0] * q_scale};
    unsigned a_p[2][4], a_ds_t[2][4];
#pragma unroll
    for (int k_step = 0; k_step < 2; ++k_step) {
      load_a(a_p[k_step], p_t_codes, kTokenRowBytes, warp * 16, 32 * k_step);
      load_a(a_ds_t[k_step], ds_t_codes, kTokenRowBytes, warp * 16, 32 * k_step);
    }
#pragma unroll
    for (int nc = 0; nc < kChannelTiles; ++nc) {
      int acc_v[4] = {0, 0, 0, 0}, acc_k[4] = {0, 0, 0, 0};
      unsigned b0[2], b1[2];
      load_b_two_steps(b0, b1, do_tile_t, kTokenRowBytes, nc * 8);
      mma_s8(acc_v, a_p[0], b0);
      mma_s8(acc_v, a_p[1], b1);
      load_b_two_steps(b0, b1, q_tile_t, kTokenRowBytes, nc * 8);
      mma_s8(acc_k, a_ds_t[0], b0);
      mma_s8(acc_k, a_ds_t[1], b1);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        dv[nc][e] += static_cast<float>(acc_v[e]) * dv_scale[e >> 1];
        dk[nc][e] += static_cast<float>(acc_k[e]) * dk_scale[e >> 1];
      }
    }
    // dQ_i += dS^ K^_j over the tile's kKeys keys: warp w takes 16 queries (w % 4) and a 1 / (kWarpCount / 4) share
    // of the channels; each K block's int32 product gets its own scale before the sum. One reduction per element
    // per tile (so kKeys = 128 halves the L2 reduction traffic of 64), into the padded dq_accum: no bounds check
    // (rows beyond tokens_q get zeros: their dS is 0).
    constexpr int kChannelGroups = kWarpCount / 4, kGroupTiles = kChannelTiles / kChannelGroups;
    const int query_group = warp % 4, first_tile = (warp / 4) * kGroupTiles;
    // dq_scales[b][half]: K block b's, for query rows g (half 0) and g + 8 (kQueryScales: each row's own dS scale)
    float dq_scales[kKeyBlocks][2];
#pragma unroll
    for (int b = 0; b < kKeyBlocks; ++b) {
      float block_ds_scale[2], unused_inverse;
      if constexpr (Config::kQueryScales) {
        const int query = query_group * 16 + g;
        int8_scale(block_query_max(query_maxima, b, query), block_ds_scale[0], unused_inverse);
        int8_scale(block_query_max(query_maxima, b, query + 8), block_ds_scale[1], unused_inverse);
      } else {
        int8_scale(maxima[b].y, block_ds_scale[0], unused_inverse);
        block_ds_scale[1] = block_ds_scale[0];
      }
#pragma unroll
      for (int half = 0; half < 2; ++half)
        dq_scales[b][half] = block_ds_scale[half] * k_scales[b] * p.softmax_scale;
    }
    unsigned a_ds[kKeyBlocks][2][4];
#pragma unroll
    for (int b = 0; b < kKeyBlocks; ++b)
#pragma unroll
      for (int k_step = 0; k_step < 2; ++k_step)
        load_a(a_ds[b][k_step], ds_codes, kKeyRowBytes, query_group * 16, b * kBlock + 32 * k_step);
    float *dq_rows =
        p.dq_accum + (q_head * padded_q + query0 + query_group * 16 + g) * kHeadDim + first_tile * 8 + 2 * t;
#pragma unroll
    for (int nc = 0; nc < kGroupTiles; ++nc) {
      float dq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int b = 0; b < kKeyBlocks; ++b) {
        int acc_q[4] = {0, 0, 0, 0};
        unsigned b0[2], b1[2];
        load_b_two_steps(b0, b1, k_tiles_t + b * kHeadDim * kTokenRowBytes, kTokenRowBytes, (first_tile + nc) * 8);
        mma_s8(acc_q, a_ds[b][0], b0);
        mma_s8(acc_q, a_ds[b][1], b1);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dq[e] += static_cast<float>(acc_q[e]) * dq_scales[b][e >> 1];
      }
      // channels 2t, 2t + 1 of queries g and g + 8
      add_pair(dq_rows + nc * 8, dq[0], dq[1]);
      add_pair(dq_rows + 8 * kHeadDim + nc * 8, dq[2], dq[3]);
    }
  }

  // dK_j (x 1/sqrt(d): dS is the gradient of S / sqrt(d)) and dV_j in the input type; with the rotation dK_j R_Q^-1,
  // staged per warp in the shared memory the loop is done with
  auto *d_k = static_cast<unsigned *>(p.d_k);
  auto *d_v = static_cast<unsigned *>(p.d_v);
  if constexpr (Config::kRotate) {
    static_assert(kUnrotateStagingBytes<kHeadDim, kWarpCount> <= kMainSharedBytes<Config>, "dK's staging fits");
    __syncthreads(); // every warp is done with the tiles
    float *staging = reinterpret_cast<float *>(shared) + warp * 16 * kUnrotateRowFloats<kHeadDim>;
    write_unrotated_key_rows<Config>(
        staging,
        [&](int nc, int half) {
          return make_float2(dk[nc][2 * half] * p.softmax_scale, dk[nc][2 * half + 1] * p.softmax_scale);
        },
        d_k + kv_head * p.tokens_kv * kHeadDim / 2, key0 + warp * 16, p.tokens_kv);
  }
#pragma unroll
  for (int nc = 0; nc < kChannelTiles; ++nc)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int key = key0 + warp * 16 + g + 8 * half, channel = nc * 8 + 2 * t;
      if (key >= p.tokens_kv)
        continue;
      const long long pair = ((kv_head * p.tokens_kv + key) * kHeadDim + channel) / 2;
      if constexpr (!Config::kRotate)
        d_k[pair] =
            pack_output<Config::kBf16>(dk[nc][2 * half] * p.softmax_scale, dk[nc][2 * half + 1] * p.softmax_scale);
      d_v[pair] = pack_output<Config::kBf16>(dv[nc][2 * half], dv[nc][2 * half + 1]);
    }
}

} // namespace sage::device::sm80::backward
