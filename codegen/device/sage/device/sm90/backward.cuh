// SageBwd's main kernel on wgmma (sm_90a; issue 12): SageAttention3's Algorithm 3, lines 7-12, with warpgroup MMAs.
// The preprocess, write_dq and (K smoothing, issue 25) k_sums launches are sm80/backward.cuh's (same workspace; the
// transposed Q and dO codes and dq_accum's rows are in the orders explained below). With K smoothing the K codes are
// of K - mean(K) and L is the correspondingly shifted LSE: this kernel reads them unchanged. With the rotation
// (Config::kRotate) the codes are of Q R_Q and K R_K: only the epilogue changes, rotating dK back (as sm80's).
//
// A CTA owns 128 keys (two 64-key K blocks) of one KV head and walks every visible 64-query tile of every query head
// of its GQA group, FlashAttention-2's backward order. Warpgroup w owns K block w; per Q tile i it computes
//   S^T  = K^_w Q^_i^T                      wgmma s8, A and B from shared memory (64 keys x 64 queries)
//   dP^T = V_w dO_i^T                       wgmma f16/bf16, A and B from shared memory (kept in 16 bits, line 8)
//   P^T = exp2(S^T scale log2(e) - L log2(e)),  dS^T = P^T o (dP^T - D)      in the accumulator registers
//   {s_P, P^}, {s_dS, dS^}                  one int8 scale per 64 x 64 tile: a reduction over the warpgroup (with
//                                           Config::kKeyScales P^T and dS^T for dV/dK one per key: over a quad)
//   dV_w += P^^T dO^_i,  dK_w += dS^^T Q^_i  wgmma s8, A from registers, B = dO^^T / Q^^T codes in shared memory
//   dS^ -> shared memory as [query][key];   then each warpgroup takes half of dQ_i's channels:
//   dQ_i = dS^ K^ (both K blocks, each with its own scale)   wgmma s8 from shared memory, into a shared f32 tile
// dK_w and dV_w stay in registers (f32) for the whole walk, as in the mma.sync kernel (see its header for why dQ is
// summed over the KV tiles in an f32 buffer). The dQ tile reaches dq_accum by one bulk reduction
// (cp.reduce.async.bulk .add.f32, issued by one thread at the start of the next step): element-wise red.global.add
// were the largest stall of the first version (ncu source counters, H100: ~29% of the samples). The tile's rows have
// their 16-byte units XORed by row % 8 so that the accumulator's stores are free of bank conflicts; dq_accum keeps
// that order (a bulk reduction copies bytes as they are) and write_dq reads it back (dq_accum_column).
//
// 8-bit A operands from registers: the accumulator gives a thread the columns 8j + 2t, 8j + 2t + 1 of each 8-column
// tile, while an 8-bit A fragment wants k = 4t .. 4t + 3. The P^T and dS^T codes are packed without moving data
// (tiles 4s, 4s + 1 of a thread's row form k = 4t .. 4t + 3 of k step s, as the forward's P~ does), which permutes the
// reduction axis (the queries) within each 32-query step; preprocess_q writes Q^^T and dO^^T with their tokens in the
// same order (accumulator_token_of_k_position), so the products are unchanged.
//
// Shared-memory tiles are in wgmma's canonical K-major layout with the swizzle of their row length (128-, 64- or
// 32-byte rows; rows of more than 128 bytes in 128-byte column chunks). K^, K^^T and V are written once by cp.async
// (16-byte units at their swizzled offsets). A step's Q^, dO, Q^^T, dO^^T and row stats arrive by five bulk copies
// that one thread issues, completing on the stage's mbarrier: the preprocess wrote those tiles to global memory in
// their shared-memory byte order (BulkTiles), so that the 255 other threads spend no instructions on copies (their
// cp.async address arithmetic was ~8% of the kernel's instructions, ncu 2026-11-24). The dS codes are written by the
// threads, each fencing the async proxy before the barrier that hands them to wgmma. Loads of Q tile i + 1 (a second
// stage) fly while tile i is computed. Two CTA barriers per step: after the stage's mbarrier, one that ends the
// previous step (its stage and dS codes may be rewritten), and both warpgroups' dS codes written, before dQ (by then
// the bulk reduction has read the previous dQ tile).
#pragma once

#include "sage/device/sm80/backward.cuh"
#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/mbarrier.cuh"
#include "sage/device/sm90/shared_tiles.cuh"
#include "sage/device/sm90/tma.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

namespace sage::device::sm90::backward {

using sm80::backward::BulkTiles;
using sm80::backward::commit_copies;
using sm80::backward::copy16_async;
using sm80::backward::int8_scale;
using sm80::backward::kBlock;
using sm80::backward::kLog2e;
using sm80::backward::pack_output;
using sm80::backward::wait_copies;

constexpr int kKeys = 2 * kBlock; // per CTA: one K block per warpgroup
constexpr int kMainThreads = 2 * kWarpgroupThreads;

// Shared memory of `main`, every tile 1024-byte aligned: K^ [128][d] int8, K^^T [d][64] int8 per K block, V [128][d]
// 16-bit; two stages of {Q^ [64][d] int8, dO [64][d] 16-bit, Q^^T and dO^^T [d][64] int8, row stats 64 x {L log2(e),
// D}}; the dS codes [64][128] int8; the dQ tile [64][d] f32; with Config::kQueryScales the warps' |dS| maxima per
// query and each K block's dS scales per query; reduction scratch.
template <class Config> struct MainLayout {
  static constexpr int kD = Config::kHeadDim;
  using KTile = SwizzledTile<kKeys, kD>;
  using KTransposedTile = SwizzledTile<kD, kBlock>;
  using VTile = SwizzledTile<kKeys, 2 * kD>;
  using QTile = typename BulkTiles<kD>::Q;
  using DoTile = typename BulkTiles<kD>::Do;
  using TransposedTile = typename BulkTiles<kD>::Transposed; // Q^^T, dO^^T
  using DsTile = SwizzledTile<kBlock, kKeys>;
  static __host__ __device__ constexpr int align(int bytes) { return (bytes + 1023) / 1024 * 1024; }
  static constexpr int kStatsBytes = kBlock * 2 * 4;

  static constexpr int kK = 0;
  static constexpr int kKTransposed = align(kK + KTile::kBytes); // two tiles
  static constexpr int kV = align(kKTransposed + 2 * KTransposedTile::kBytes);
  static constexpr int kStages = align(kV + VTile::kBytes);
  // within a stage
  static constexpr int kQ = 0;
  static constexpr int kDo = align(kQ + QTile::kBytes);
  static constexpr int kQTransposed = align(kDo + DoTile::kBytes);
  static constexpr int kDoTransposed = align(kQTransposed + TransposedTile::kBytes);
  static constexpr int kStats = align(kDoTransposed + TransposedTile::kBytes);
  static constexpr int kStageBytes = align(kStats + kStatsBytes);
  static constexpr int kStageCopyBytes = QTile::kBytes + DoTile::kBytes + 2 * TransposedTile::kBytes + kStatsBytes;

  static constexpr int kDs = kStages + 2 * kStageBytes;
  // dQ_i's f32 tile, [64][d] with dq_accum's swizzle (sm80::backward::dq_accum_column), for one bulk reduction
  static constexpr int kDq = align(kDs + DsTile::kBytes);
  static constexpr int kDqBytes = kBlock * kD * 4;
  // kQueryScales: [warpgroup][warp][64 queries] |dS| maxima, then [warpgroup][64 queries] dS scales for dQ
  static constexpr int kQueryMaxima = kDq + kDqBytes;
  static constexpr int kQueryScaleFloats = Config::kQueryScales ? (2 * 4 + 2) * kBlock : 0;
  // 2 warpgroups x 4 warps x {P max, |dS| max}, then the dS scale of each K block; then each stage's mbarrier
  static constexpr int kScratch = align(kQueryMaxima + kQueryScaleFloats * 4);
  static constexpr int kScratchBytes = (2 * 4 * 2 + 2) * 4;
  static constexpr int kBarriers = kScratch + 80;
  static constexpr int kTotal = kBarriers + 2 * 8;
  static constexpr int kDynamicBytes = kTotal + 1024; // the dynamic buffer is 16-byte aligned: rounded up in-kernel
};

template <class Config> constexpr int kMainSharedBytes = MainLayout<Config>::kDynamicBytes;

// kRows rows of kRowBytes (contiguous in global memory from `source`) into a swizzled tile; rows at or beyond
// `valid_rows` become zeros without being read.
template <class Tile, int kRows, int kRowBytes>
__device__ __forceinline__ void copy_rows_swizzled(unsigned char *tile, const void *source, long long valid_rows) {
  constexpr int kUnitsPerRow = kRowBytes / 16, kUnits = kRows * kUnitsPerRow;
  static_assert(kUnits % kMainThreads == 0, "every thread copies the same number of units");
  const auto *bytes = static_cast<const unsigned char *>(source);
#pragma unroll
  for (int i = 0; i < kUnits / kMainThreads; ++i) {
    const int unit = static_cast<int>(threadIdx.x) + i * kMainThreads;
    const int row = unit / kUnitsPerRow, column = unit % kUnitsPerRow * 16;
    const bool valid = row < valid_rows;
    copy16_async(tile + Tile::offset(row, column), valid ? bytes + unit * 16 : bytes, valid);
  }
}

template <bool kBf16, int N>
__device__ __forceinline__ void wgmma_16bit_ss(float (&d)[N / 2], unsigned long long a, unsigned long long b,
                                               int scale_d) {
  if constexpr (kBf16)
    WgmmaBf16SS<N>::run(d, a, b, scale_d);
  else
    WgmmaF16SS<N>::run(d, a, b, scale_d);
}

// P^T = exp2(S^T scale - L log2(e)) of this thread's 32 accumulator elements, with their maxima: per key row with
// kKeyScales (index e / 2: rows g and g + 8), else all in [0]. Element 4j + e is key row g + 8 (e / 2) and query column
// 8j + 2t + e % 2 of the warp's 16 x 64 part. kCheckVisibility: element 4j + e is visible iff
// 8j + e % 2 >= first_visible[e / 2] (visibility_thresholds: the KV end and the causal diagonal as one compare).
template <bool kKeyScales, bool kCheckVisibility>
__device__ __forceinline__ void probabilities(const int (&s)[32], float (&p)[32], float (&p_max)[2],
                                              const float *row_stats, float score_scale,
                                              const int (&first_visible)[2]) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    // {L log2(e), D} of columns 8j + 2t and 8j + 2t + 1: one 16-byte load
    const float4 stats = *reinterpret_cast<const float4 *>(row_stats + 2 * (8 * j + 2 * t));
    const float2 lse_log2 = make_float2(stats.x, stats.z);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float probability =
          fast_exp2(fmaf(small_int_to_float(s[4 * j + e]), score_scale, -(e & 1 ? lse_log2.y : lse_log2.x)));
      if constexpr (kCheckVisibility)
        probability = 8 * j + (e & 1) >= first_visible[e >> 1] ? probability : 0.0f;
      p[4 * j + e] = probability;
      p_max[kKeyScales ? e >> 1 : 0] = fmaxf(p_max[kKeyScales ? e >> 1 : 0], probability);
    }
  }
}

// dS^T = P^T o (dP^T - D) in place of dP^T (the same elements), with its largest magnitudes (as probabilities').
template <bool kKeyScales>
__device__ __forceinline__ void score_gradients(const float (&p)[32], float (&dp)[32], float (&ds_max)[2],
                                                const float *row_stats) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 stats = *reinterpret_cast<const float4 *>(row_stats + 2 * (8 * j + 2 * t));
    const float2 delta = make_float2(stats.y, stats.w);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[4 * j + e] = p[4 * j + e] * (dp[4 * j + e] - (e & 1 ? delta.y : delta.x));
      ds_max[kKeyScales ? e >> 1 : 0] = fmaxf(ds_max[kKeyScales ? e >> 1 : 0], fabsf(dp[4 * j + e]));
    }
  }
}

// For this thread's key rows `key` and `key` + 8: the first of its query columns (relative to query_base, the query of
// its column 0) that may see the key: none (a large number) beyond the KV end, causal: key - causal_offset.
template <class Config>
__device__ __forceinline__ void visibility_thresholds(int (&first_visible)[2], int key, int query_base, int tokens_kv,
                                                      int causal_offset) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row_key = key + 8 * half;
    first_visible[half] =
        row_key >= tokens_kv ? 1 << 20 : (Config::kCausal ? row_key - causal_offset - query_base : -(1 << 20));
  }
}

// The A fragments of two 32-query k steps from a 64 x 64 accumulator's elements times `inverse` (int8 codes):
// register r holds key row g + 8 (r % 2) of the thread, whose elements take inverse[r % 2] (per-key scales; per tile
// both are the tile's).
__device__ __forceinline__ void pack_a_fragments(unsigned (&a)[2][4], const float (&x)[32], const float (&inverse)[2]) {
#pragma unroll
  for (int step = 0; step < 2; ++step) {
    const float *v = x + 16 * step;
    const float low = inverse[0], high = inverse[1];
    a[step][0] = pack_s8x4(v[0] * low, v[1] * low, v[4] * low, v[5] * low);
    a[step][1] = pack_s8x4(v[2] * high, v[3] * high, v[6] * high, v[7] * high);
    a[step][2] = pack_s8x4(v[8] * low, v[9] * low, v[12] * low, v[13] * low);
    a[step][3] = pack_s8x4(v[10] * high, v[11] * high, v[14] * high, v[15] * high);
  }
}

// The maxima of each of `values` over this warpgroup (4 warps), in place: `scratch` holds 4 x kCount floats of it.
// kLowestLane: lanes closer than this (a quad: 4) already hold equal values.
template <int kCount, int kLowestLane = 1>
__device__ __forceinline__ void warpgroup_max(float (&values)[kCount], float *scratch, int warpgroup) {
#pragma unroll
  for (int offset = 16; offset >= kLowestLane; offset >>= 1)
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      values[i] = fmaxf(values[i], __shfl_xor_sync(0xffffffffu, values[i], offset));
  const int warp = (threadIdx.x >> 5) & 3;
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int i = 0; i < kCount; ++i)
      scratch[kCount * warp + i] = values[i];
  named_barrier_sync(1 + warpgroup, kWarpgroupThreads);
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    values[i] = scratch[i];
#pragma unroll
    for (int w = 1; w < 4; ++w)
      values[i] = fmaxf(values[i], scratch[kCount * w + i]);
  }
}

// accumulator += product x scale, for s32 products below 2^22 in magnitude (64-token int8 products are).
template <int kCount>
__device__ __forceinline__ void add_scaled(float (&accumulator)[kCount], const int (&product)[kCount], float scale) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    accumulator[i] = fmaf(small_int_to_float(product[i]), scale, accumulator[i]);
}

template <class Config> __device__ void backward_main(const SageBackwardParams &p, unsigned char *raw_shared) {
  static_assert(Config::kBulkTiles, "the Q-side tiles arrive by bulk copies of the preprocess's swizzled blocks");
  using Layout = MainLayout<Config>;
  constexpr int kD = Config::kHeadDim, kTileBytes = kBlock * kD;
  using KTile = typename Layout::KTile;
  using KTransposedTile = typename Layout::KTransposedTile;
  using VTile = typename Layout::VTile;
  using QTile = typename Layout::QTile;
  using DoTile = typename Layout::DoTile;
  using TransposedTile = typename Layout::TransposedTile;
  using DsTile = typename Layout::DsTile;

  const unsigned raw_base = static_cast<unsigned>(__cvta_generic_to_shared(raw_shared));
  const unsigned base = (raw_base + 1023u) & ~1023u;
  unsigned char *shared = raw_shared + (base - raw_base);
  float *scratch = reinterpret_cast<float *>(shared + Layout::kScratch);
  float *ds_block_scales = scratch + 16;
  float *query_maxima = reinterpret_cast<float *>(shared + Layout::kQueryMaxima); // kQueryScales
  float *query_ds_scales = query_maxima + 2 * 4 * kBlock;                         // kQueryScales

  // warp-uniform by construction (a shuffle from lane 0): wgmma under a branch ptxas considers divergent serializes
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int key0 = blockIdx.x * kKeys;
  const int kv_blocks = (p.tokens_kv + kBlock - 1) / kBlock, q_blocks = (p.tokens_q + kBlock - 1) / kBlock;
  const long long padded_q = static_cast<long long>(q_blocks) * kBlock;
  const long long kv_head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const int first_kv_block = blockIdx.x * 2;
  float k_scales[2];
#pragma unroll
  for (int b = 0; b < 2; ++b)
    k_scales[b] = first_kv_block + b < kv_blocks ? p.k_scales[kv_head * kv_blocks + first_kv_block + b] : 0.0f;
  const float k_scale = warpgroup == 0 ? k_scales[0] : k_scales[1];
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int causal_offset = p.tokens_kv - p.tokens_q;
  const int block_key0 = key0 + warpgroup * kBlock; // this warpgroup's first key
  const bool partial_kv_block = block_key0 + kBlock > p.tokens_kv;
  const sm80::backward::StepWalk walk = sm80::backward::step_walk<Config::kCausal>(p, key0, q_blocks);
  const int steps = walk.steps;

  // The walk's (query head, Q tile) advanced step by step: StepWalk's division per step, twice per step, was ~3% of
  // the kernel's instructions.
  struct Cursor {
    long long q_head;
    int q_block;
  };
  auto advance = [&](Cursor c) {
    if (++c.q_block == q_blocks) {
      c.q_block = walk.first_q_block;
      ++c.q_head;
    }
    return c;
  };

  // Q^, dO, Q^^T, dO^^T and the row stats of a step into its stage: five bulk copies (one thread) on its mbarrier.
  const unsigned full_barrier0 = base + Layout::kBarriers;
  auto issue_stage = [&](Cursor at, int step) {
    const long long q_head = at.q_head;
    const int q_block = at.q_block;
    const long long q_codes = (q_head * q_blocks + q_block) * kTileBytes;
    const unsigned stage = base + Layout::kStages + (step & 1) * Layout::kStageBytes;
    const unsigned full = full_barrier0 + 8 * (step & 1);
    mbarrier_arrive_expect_tx(full, Layout::kStageCopyBytes);
    bulk_copy_to_shared(stage + Layout::kQ, p.q_codes + q_codes, QTile::kBytes, full);
    bulk_copy_to_shared(stage + Layout::kDo, p.do_tiles + q_codes, DoTile::kBytes, full);
    bulk_copy_to_shared(stage + Layout::kQTransposed, p.q_codes_t + q_codes, TransposedTile::kBytes, full);
    bulk_copy_to_shared(stage + Layout::kDoTransposed, p.do_codes_t + q_codes, TransposedTile::kBytes, full);
    bulk_copy_to_shared(stage + Layout::kStats, p.row_stats + 2 * (q_head * padded_q + q_block * kBlock),
                        Layout::kStatsBytes, full);
  };
  if (threadIdx.x == 0) {
    mbarrier_init(full_barrier0, 1);
    mbarrier_init(full_barrier0 + 8, 1);
    mbarrier_init_fence();
  }
  __syncthreads(); // the barriers are initialised before anyone waits on them

  if (steps > 0) { // K^, K^^T, V of this KV tile: one cp.async group
    const long long k_codes = (kv_head * kv_blocks + first_kv_block) * kTileBytes;
    copy_rows_swizzled<KTile, kKeys, kD>(shared + Layout::kK, p.k_codes + k_codes,
                                         static_cast<long long>(kv_blocks - first_kv_block) * kBlock);
#pragma unroll
    for (int b = 0; b < 2; ++b)
      copy_rows_swizzled<KTransposedTile, kD, kBlock>(shared + Layout::kKTransposed + b * KTransposedTile::kBytes,
                                                      p.k_codes_t + k_codes + b * kTileBytes,
                                                      first_kv_block + b < kv_blocks ? kD : 0);
    copy_rows_swizzled<VTile, kKeys, 2 * kD>(
        shared + Layout::kV, static_cast<const unsigned short *>(p.v) + (kv_head * p.tokens_kv + key0) * kD,
        p.tokens_kv - key0);
  }
  Cursor current{static_cast<long long>(blockIdx.z) * p.heads_q + walk.first_head, walk.first_q_block}; // step 0
  if (steps > 0) {
    commit_copies();
    if (threadIdx.x == 0)
      issue_stage(current, 0);
    wait_copies<0>(); // K^, K^^T, V: published to wgmma by step 0's CTA barrier
  }

  float dk[kD / 2] = {}, dv[kD / 2] = {};
  const unsigned k_tile = base + Layout::kK, v_tile = base + Layout::kV, ds_tile = base + Layout::kDs;
  const unsigned k_transposed = base + Layout::kKTransposed, dq_tile = base + Layout::kDq;
  float *previous_dq_tile = nullptr; // dq_accum's rows of the previous step's Q tile
  for (int step = 0; step < steps; ++step) {
    const long long q_head = current.q_head;
    const int q_block = current.q_block, query0 = q_block * kBlock;
    const Cursor next = advance(current);
    const float q_scale = p.q_scales[q_head * q_blocks + q_block], do_scale = p.do_scales[q_head * q_blocks + q_block];
    const int stage_offset = Layout::kStages + (step & 1) * Layout::kStageBytes;
    const unsigned stage = base + stage_offset;
    const float *row_stats = reinterpret_cast<const float *>(shared + stage_offset + Layout::kStats);
    fence_shared_for_wgmma(); // K^, K^^T, V (step 0) and the previous step's dQ tile, for the async proxy
    mbarrier_wait(full_barrier0 + 8 * (step & 1), (step >> 1) & 1); // this step's stage has landed
    __syncthreads(); // every warpgroup is done with the previous step (its stage and the dS codes)
    if (threadIdx.x == 0) {
      if (step + 1 < steps)
        issue_stage(next, step + 1); // into the stage the previous step used: lands while this step runs
      if (step > 0)                  // the previous step's dQ tile, written and fenced before the barrier
        bulk_reduce_add_f32(previous_dq_tile, dq_tile, Layout::kDqBytes);
    }

    // S^T = K^_w Q^^T and dP^T = V_w dO^T as two wgmma groups: P^T is computed while dP^T's group still runs
    int s[32];
    float dp[32];
    warpgroup_fence_operands(s);
    warpgroup_fence_operands(dp);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kD / 32; ++k)
      WgmmaS8SS<64>::run(s, KTile::descriptor(k_tile, 32 * k, warpgroup * kBlock),
                         QTile::descriptor(stage + Layout::kQ, 32 * k), k > 0);
    wgmma_commit_group();
#pragma unroll
    for (int k = 0; k < 2 * kD / 32; ++k)
      wgmma_16bit_ss<Config::kBf16, 64>(dp, VTile::descriptor(v_tile, 32 * k, warpgroup * kBlock),
                                        DoTile::descriptor(stage + Layout::kDo, 32 * k), k > 0);
    wgmma_commit_group();
    wgmma_wait_group<1>();
    warpgroup_fence_operands(s);

    // P^T, then dS^T; only blocks that cross the KV end or the causal diagonal test each element
    const float score_scale = q_scale * k_scale * scale_log2;
    bool masked = partial_kv_block;
    if constexpr (Config::kCausal)
      masked = masked || block_key0 + kBlock - 1 > query0 + causal_offset;
    constexpr bool kKeyScales = Config::kKeyScales;
    float prob[32];
    float p_max[2] = {0.0f, 0.0f}, ds_max[2] = {0.0f, 0.0f}; // per key row g, g + 8 with kKeyScales, else in [0]
    if (masked) {
      int first_visible[2];
      visibility_thresholds<Config>(first_visible, block_key0 + 16 * warp + g, query0 + 2 * t, p.tokens_kv,
                                    causal_offset);
      probabilities<kKeyScales, true>(s, prob, p_max, row_stats, score_scale, first_visible);
    } else {
      const int unused[2] = {0, 0};
      probabilities<kKeyScales, false>(s, prob, p_max, row_stats, score_scale, unused);
    }
    wgmma_wait_group<0>();
    warpgroup_fence_operands(dp);
    score_gradients<kKeyScales>(prob, dp, ds_max, row_stats);
    // {s_P, P^}, {s_dS, dS^}: one scale per 64 x 64 tile (a warpgroup reduction). With Config::kKeyScales (issue 25)
    // P^T for dV and dS^T for dK take one scale per key instead: a key row's 64 queries lie in its quad (the maxima
    // of 4 threads: 2 shuffles each), and the scale factors out of the key's row of dV_w and dK_w; dS for dQ keeps
    // the tile's scale (the warpgroup reduction of the quads' maxima: 3 shuffles), packed a second time. With
    // Config::kQueryScales dS for dQ takes one scale per query of the K block instead: a query's column spans the
    // warpgroup's 4 warps, so each warp's column maxima (a reduce-scatter over its lanes) meet in shared memory at
    // the warpgroup barrier; the scale factors out of dQ_i's row, applied to the dQ products' rows below.
    constexpr bool kQueryScales = Config::kQueryScales;
    float *group_query_maxima = query_maxima + warpgroup * 4 * kBlock;
    if constexpr (kQueryScales) {
      float column_values[16];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          column_values[2 * j + c] = fmaxf(fabsf(dp[4 * j + c]), fabsf(dp[4 * j + c + 2]));
      reinterpret_cast<float2 *>(group_query_maxima + warp * kBlock)[lane] =
          sm80::backward::column_maxima(column_values);
    }
    float p_scale[2], p_inverse[2], ds_t_scale[2], ds_t_inverse[2], ds_scale = 0.0f, ds_inverse = 0.0f;
    unsigned p_codes[2][4], ds_codes[2][4], ds_t_codes[2][4], ds_q_codes[2][4];
    if constexpr (kKeyScales) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        p_max[half] = quad_max(p_max[half]);
        ds_max[half] = quad_max(ds_max[half]);
        int8_scale(p_max[half], p_scale[half], p_inverse[half]);
        int8_scale(ds_max[half], ds_t_scale[half], ds_t_inverse[half]);
      }
      if constexpr (kQueryScales) {
        named_barrier_sync(1 + warpgroup, kWarpgroupThreads); // the warps' query maxima are visible
      } else {
        float tile_ds_max[1] = {fmaxf(ds_max[0], ds_max[1])};
        warpgroup_max<1, 4>(tile_ds_max, scratch + 8 * warpgroup, warpgroup);
        int8_scale(tile_ds_max[0], ds_scale, ds_inverse);
      }
      pack_a_fragments(ds_t_codes, dp, ds_t_inverse);
    } else {
      float maxima[2] = {p_max[0], ds_max[0]};
      warpgroup_max<2>(maxima, scratch + 8 * warpgroup, warpgroup);
      int8_scale(maxima[0], p_scale[0], p_inverse[0]);
      int8_scale(maxima[1], ds_scale, ds_inverse);
      p_scale[1] = p_scale[0];
      p_inverse[1] = p_inverse[0];
    }
    pack_a_fragments(p_codes, prob, p_inverse);
    if constexpr (!(kKeyScales && kQueryScales)) { // the tile's dS codes: for dK (per-tile scales) or dQ
      const float ds_inverses[2] = {ds_inverse, ds_inverse};
      pack_a_fragments(ds_codes, dp, ds_inverses);
    }
    if constexpr (kQueryScales) { // dS scaled per query (in place: dp's last use), its scales for dQ's rows
      const float2 amax = sm80::backward::block_query_max_pair(query_maxima, warpgroup, 2 * lane);
      float2 query_scale, query_inverse;
      int8_scale(amax.x, query_scale.x, query_inverse.x);
      int8_scale(amax.y, query_scale.y, query_inverse.y);
      if (warp == 0)
        reinterpret_cast<float2 *>(query_ds_scales + warpgroup * kBlock)[lane] = query_scale;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float2 inverse = sm80::backward::of_columns(query_inverse, j);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dp[4 * j + e] *= e & 1 ? inverse.y : inverse.x;
      }
      const float unscaled[2] = {1.0f, 1.0f};
      pack_a_fragments(ds_q_codes, dp, unscaled);
    }

    // dS^ as [query][key] for dQ: byte b of register r of step s is key g + 8 (r % 2), query 8 J + 2t + b % 2 with
    // J = 4s + 2 (r / 2) + b / 2 (the packing order above). In the 128-byte swizzled rows the XOR term is
    // (query % 8) << 4 = (2t + b % 2) << 4, the same for every J: four base offsets, J x 1024 bytes apart.
    static_assert(DsTile::kChunkBytes == 128, "one 128-byte row per query");
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int row_key = warpgroup * kBlock + 16 * warp + g + 8 * (r & 1), row_in_atom = 2 * t + (b & 1);
        const unsigned at = ds_tile + row_in_atom * 128 + (row_key ^ (row_in_atom << 4));
#pragma unroll
        for (int step_k = 0; step_k < 2; ++step_k)
          store_shared_byte(at + (4 * step_k + 2 * (r >> 1) + (b >> 1)) * 1024,
                            (kQueryScales ? ds_q_codes : ds_codes)[step_k][r] >> (8 * b));
      }
    if (!kQueryScales && threadIdx.x % kWarpgroupThreads == 0)
      ds_block_scales[warpgroup] = ds_scale;

    // dV_w += P^^T dO^ and dK_w += dS^^T Q^: s32 products scaled into the f32 sums, at most 64 channels at a time
    // (a 32-register product: the 2 x d / 2 f32 sums already hold most of the register file). Element i of the
    // product of channels [64h, 64h + 64) is element 32h + i of the sums. Two product buffers: product n + 1 runs on
    // the tensor cores while product n is scaled into its sums (waiting for each product before the next was ~8% of
    // the stall samples, ncu 2026-11-24).
    constexpr int kProductChannels = kD < 64 ? kD : 64, kHalves = kD / kProductChannels, kProducts = 2 * kHalves;
    int product[2][kProductChannels / 2];
    auto issue_product = [&](int n) { // product n: operand n / kHalves (dV, dK), channels of half n % kHalves
      const int operand = n / kHalves, h = n % kHalves;
      const unsigned b_tile = stage + (operand == 0 ? Layout::kDoTransposed : Layout::kQTransposed);
      warpgroup_fence_operands(product[n & 1]);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < 2; ++k)
        WgmmaS8RS<kProductChannels>::run(product[n & 1],
                                         operand == 0 ? p_codes[k] : (kKeyScales ? ds_t_codes[k] : ds_codes[k]),
                                         TransposedTile::descriptor(b_tile, 32 * k, h * kProductChannels), k > 0);
      wgmma_commit_group();
    };
    issue_product(0);
#pragma unroll
    for (int n = 0; n < kProducts; ++n) {
      if (n + 1 < kProducts) {
        issue_product(n + 1);
        wgmma_wait_group<1>();
      } else {
        wgmma_wait_group<0>();
      }
      warpgroup_fence_operands(product[n & 1]);
      const int operand = n / kHalves, h = n % kHalves;
      // element i of a product is key row g + 8 ((i / 2) % 2): per-key scales take that row's
      float scale[2];
#pragma unroll
      for (int half = 0; half < 2; ++half)
        scale[half] = operand == 0 ? p_scale[half] * do_scale : (kKeyScales ? ds_t_scale[half] : ds_scale) * q_scale;
      float *sums = operand == 0 ? dv : dk;
#pragma unroll
      for (int i = 0; i < kProductChannels / 2; ++i)
        sums[h * kProductChannels / 2 + i] =
            fmaf(small_int_to_float(product[n & 1][i]), scale[(i >> 1) & 1], sums[h * kProductChannels / 2 + i]);
    }

    fence_shared_for_wgmma(); // the dS codes
    if (threadIdx.x == 0)
      bulk_wait_source_read(); // the dQ tile is rewritten below
    __syncthreads();           // ... of both warpgroups, and both K blocks' dS scales (per query: query_ds_scales)

    // dQ_i = dS^ K^ for channels [w d / 2, (w + 1) d / 2), 32 channels at a time (register budget, as above): one s32
    // product per K block, each with its scale, into the shared dQ tile; the next step's first thread adds the tile
    // to dq_accum with one bulk reduction (instead of 64 x d / 2 element reductions per warpgroup). Element 4j + e of
    // a piece is query 16 warp + g + 8 (e / 2), channel 8j + 2t + e % 2 of the piece.
    constexpr int kHalf = kD / 2, kPieceChannels = 32;
    // dq_scales[b][half]: K block b's, for query rows 16 warp + g (half 0) and + 8 (kQueryScales: each row's own)
    float dq_scales[2][2];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        dq_scales[b][half] =
            (kQueryScales ? query_ds_scales[b * kBlock + 16 * warp + g + 8 * half] : ds_block_scales[b]) * k_scales[b] *
            p.softmax_scale;
    // Every piece's products are issued first (one wgmma group each), so that later pieces compute while earlier ones
    // are scaled and stored.
    constexpr int kPieces = kHalf / kPieceChannels;
    static_assert(kPieces >= 1 && kPieces <= 2, "the waits below assume one or two pieces");
    int dq_products[kPieces][2][kPieceChannels / 2];
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) {
      warpgroup_fence_operands(dq_products[piece][0]);
      warpgroup_fence_operands(dq_products[piece][1]);
      wgmma_fence();
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int k = 0; k < 2; ++k)
          WgmmaS8SS<kPieceChannels>::run(dq_products[piece][b], DsTile::descriptor(ds_tile, b * kBlock + 32 * k),
                                         KTransposedTile::descriptor(k_transposed + b * KTransposedTile::kBytes, 32 * k,
                                                                     warpgroup * kHalf + piece * kPieceChannels),
                                         k > 0);
      wgmma_commit_group();
    }
#pragma unroll
    for (int piece = 0; piece < kPieces; ++piece) {
      if (piece + 1 < kPieces)
        wgmma_wait_group<kPieces - 1>(); // kPieces <= 2: the later piece may still run
      else
        wgmma_wait_group<0>();
      warpgroup_fence_operands(dq_products[piece][0]);
      warpgroup_fence_operands(dq_products[piece][1]);
#pragma unroll
      for (int j = 0; j < kPieceChannels / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int e = 4 * j + 2 * half, row = 16 * warp + g + 8 * half;
          const int channel = warpgroup * kHalf + piece * kPieceChannels + 8 * j + 2 * t;
          store_shared_pair(dq_tile + (row * kD + sm80::backward::dq_accum_column<Config>(row, channel)) * 4,
                            small_int_to_float(dq_products[piece][0][e]) * dq_scales[0][half] +
                                small_int_to_float(dq_products[piece][1][e]) * dq_scales[1][half],
                            small_int_to_float(dq_products[piece][0][e + 1]) * dq_scales[0][half] +
                                small_int_to_float(dq_products[piece][1][e + 1]) * dq_scales[1][half]);
        }
    }
    previous_dq_tile = p.dq_accum + (q_head * padded_q + query0) * kD;
    current = next;
  }
  fence_shared_for_wgmma(); // the last step's dQ tile
  __syncthreads();
  if (steps > 0 && threadIdx.x == 0) {
    bulk_reduce_add_f32(previous_dq_tile, dq_tile, Layout::kDqBytes);
    bulk_wait_complete();
  }

  // dK_w (x 1/sqrt(d): dS is the gradient of S / sqrt(d)) and dV_w in the input type; element 4j + e is key
  // 16 warp + g + 8 (e / 2), channel 8j + 2t + e % 2. With the rotation dK_w R_Q^-1, staged per warp in shared memory
  // once the bulk reduction has read the last dQ tile.
  auto *d_k = static_cast<unsigned *>(p.d_k);
  auto *d_v = static_cast<unsigned *>(p.d_v);
  if constexpr (Config::kRotate) {
    static_assert(sm80::backward::kUnrotateStagingBytes<kD, 8> <= Layout::kTotal, "dK's staging fits");
    __syncthreads(); // thread 0's bulk reduction has completed
    float *staging =
        reinterpret_cast<float *>(shared) + (threadIdx.x >> 5) * 16 * sm80::backward::kUnrotateRowFloats<kD>;
    sm80::backward::write_unrotated_key_rows<Config>(
        staging,
        [&](int j, int half) {
          return make_float2(dk[4 * j + 2 * half] * p.softmax_scale, dk[4 * j + 2 * half + 1] * p.softmax_scale);
        },
        d_k + kv_head * p.tokens_kv * kD / 2, key0 + warpgroup * kBlock + 16 * warp, p.tokens_kv);
  }
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row_key = key0 + warpgroup * kBlock + 16 * warp + g + 8 * half, channel = 8 * j + 2 * t;
      if (row_key >= p.tokens_kv)
        continue;
      const int e = 4 * j + 2 * half;
      const long long pair = ((kv_head * p.tokens_kv + row_key) * kD + channel) / 2;
      if constexpr (!Config::kRotate)
        d_k[pair] = pack_output<Config::kBf16>(dk[e] * p.softmax_scale, dk[e + 1] * p.softmax_scale);
      d_v[pair] = pack_output<Config::kBf16>(dv[e], dv[e + 1]);
    }
}

} // namespace sage::device::sm90::backward
