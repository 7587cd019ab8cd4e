// SLA's fused sparse backward (launch 4c; sla/sparse_backward.cuh says what it computes) on sm_90a's warpgroup MMAs:
// FlashAttention-3's backward loop over the critical (q block, kv block) pairs of one work unit (a kv block's pairs,
// or a share of them: abi.cuh's sage_sla_sparse_unit_capacity). One warpgroup (128 threads) owns the kv block's 64
// keys; K and V are staged once; per critical q block (two stages, the next one's cp.async copies in flight while
// this one computes):
//   S^T  = K Q^T, dP^T = V dO^s^T        m64n64k16 f16 SS wgmma, two groups: P^T = 2^(S^T scale log2 e - L log2 e)
//                                        is computed while dP^T's group still runs
//   dV += P^T dO^s                       P^T rounded to f16 A fragments; f16 RS wgmma with B = dO^s as stored
//                                        ([query][channel]: MN-major, wgmma's transpose bit), running while dS^T is
//                                        computed
//   dS^T = P^T o (dP^T - D^s)            in the accumulator registers, then f16 A fragments
//   dK += dS^T Q                         as dV; dK and dV stay in the accumulators for the whole walk
//   dQ = dS K                            dS^T to shared memory ([key][query] f16), then m64n64k16 SS wgmma with A = dS
//                                        (MN-major from the [key][query] tile) and B = K (MN-major), 64 channels at a
//                                        time, through an f32 tile in shared memory (over the stage's Q and dO^s)
//                                        and added to dQ by one bulk reduction per warp (the copy engine)
// The accumulator of an m64 wgmma gives each warp 16 rows in mma.sync's m16n8 layout (element 4j + e: row g + 8 (e / 2)
// of the warp's 16, column 8j + 2t + e % 2), which is also the layout of a 16-bit A fragment's k step (columns 16s ..
// 16s + 15 are tiles 2s, 2s + 1): P^T and dS^T become A operands without moving data.
// Every tile is [row][channel] f16 in wgmma's 128-byte-swizzled layout (sm90::SwizzledTile), written by cp.async at
// swizzled offsets; each thread fences the async proxy before the CTA barrier that hands a stage to wgmma. Rows past
// the q block's end are zeros with L = +inf (P = 0, so dS = 0); keys past the kv block's end are zeros (their dK and
// dV rows are not written, their dQ terms are 0 times K's zero rows).
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/tensor_core.cuh"
#include "sage/device/sm90/shared_tiles.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

// Whether this module's fused sparse backward may be the wgmma kernel (sm_90a; abi.cuh's
// sage_sla_sparse_fused_wgmma says for which shapes) or is mma.sync (every other arch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SAGE_SLA_SPARSE_FUSED_SM90 1
#else
#define SAGE_SLA_SPARSE_FUSED_SM90 0
#endif

namespace sage::device::sla {

#if SAGE_SLA_SPARSE_FUSED_SM90

// Shared memory (abi.cuh's sage_sla_sparse_fused_shared_bytes_sm90): K, V, dS^T, two stages of {Q, dO^s}, then the
// stages' L and D^s rows; every tile 1024-byte aligned.
template <int D, int BLOCK_Q, int BLOCK_KV> struct SparseFusedWgmmaLayout {
  static_assert(BLOCK_Q == 64 && BLOCK_KV == 64 && (D == 64 || D == 128), "abi.cuh's sage_sla_sparse_fused_wgmma");
  using RowTile = sm90::SwizzledTile<64, 2 * D>;            // K, V, Q, dO^s: [token][channel]
  using DsTile = sm90::SwizzledTile<BLOCK_KV, 2 * BLOCK_Q>; // dS^T: [key][query], one 128-byte chunk
  static constexpr int kK = 0, kV = RowTile::kBytes, kDs = 2 * RowTile::kBytes;
  // Stage s at kStages + s kStageBytes: Q, dO^s; the dQ tile (f32 rows of 4 D bytes, unpadded: a warp's 16 rows are
  // one contiguous span, as in dQ) takes the stage once dK and dV have read it.
  static constexpr int kDqRowBytes = 4 * D;
  static constexpr int kStageBytes = 2 * RowTile::kBytes;
  static constexpr int kStages = kDs + DsTile::kBytes;
  static constexpr int kStats = kStages + 2 * kStageBytes;                  // [stage][L, D^s][BLOCK_Q] f32
  static constexpr int kDynamicBytes = kStats + 2 * 2 * BLOCK_Q * 4 + 1024; // the base is rounded up to 1024 in-kernel
  static_assert(RowTile::kBytes % 1024 == 0 && DsTile::kBytes % 1024 == 0 && kStageBytes % 1024 == 0,
                "tiles at 1024-byte boundaries");
  static_assert(BLOCK_Q * kDqRowBytes == kStageBytes, "the dQ tile fills a stage");
  static_assert(kDynamicBytes == sage_sla_sparse_fused_shared_bytes_sm90(D, BLOCK_Q, BLOCK_KV),
                "abi.cuh's size of the wgmma fused backward's shared memory");
  // MN-major operands (B = dO^s, Q, K; A = dS): LBO the next 64 columns (the next chunk), SBO the next 8 rows along k.
  static constexpr unsigned long long kRowsMnFixed =
      sm90::matrix_descriptor(0, RowTile::kChunkStride, 8 * RowTile::kChunkBytes, RowTile::kSwizzle);
  static constexpr unsigned long long kDsMnFixed =
      sm90::matrix_descriptor(0, DsTile::kChunkStride, 8 * DsTile::kChunkBytes, DsTile::kSwizzle);
};

// The MN-major operand of 16 k rows from k0 (a multiple of 16) and the 64-column chunk `chunk` of a tile.
template <class Tile>
__device__ __forceinline__ unsigned long long mn_major_descriptor(unsigned long long fixed, unsigned tile, int k0,
                                                                  int chunk = 0) {
  return fixed | static_cast<unsigned long long>((tile + chunk * Tile::kChunkStride + k0 * Tile::kChunkBytes) >> 4);
}

// kRows x D of an f16 [.., tokens, D] tensor (rows from `first`, `valid` of them) into a swizzled tile, as 16-byte
// cp.async units at their swizzled offsets in the current group of copies; rows past `valid` become zeros without
// being read. Rows that are not 16-byte aligned go through registers (2-byte loads, 16-byte stores).
template <class Tile, int kRows, int D>
__device__ __forceinline__ void copy_rows_swizzled_f16(unsigned char *tile, const void *source,
                                                       const SageSlaStrides &strides, int b, int h, int first,
                                                       int valid) {
  constexpr int kUnitsPerRow = D / 8, kUnits = kRows * kUnitsPerRow;
  static_assert(kUnits % sm90::kWarpgroupThreads == 0, "every thread copies the same number of units");
  const unsigned short *rows = static_cast<const unsigned short *>(source) + element_index(strides, b, h, first, 0);
  if (strides.token % 8 == 0 && reinterpret_cast<unsigned long long>(rows) % 16 == 0) {
    // A thread's units are kRowsPerPass rows apart: a multiple of 8, so one swizzle phase, a fixed shared stride.
    constexpr int kRowsPerPass = sm90::kWarpgroupThreads / kUnitsPerRow;
    static_assert(kRowsPerPass % 8 == 0, "a thread's rows share their swizzle phase");
    const int row0 = static_cast<int>(threadIdx.x) / kUnitsPerRow,
              column = static_cast<int>(threadIdx.x) % kUnitsPerRow * 8;
    const unsigned short *from = rows + row0 * strides.token + column;
    const long long pass_stride = kRowsPerPass * strides.token;
    unsigned char *to = tile + Tile::offset(row0, 2 * column);
    if (valid >= kRows) { // every row (the usual case): no per-row tests and selects
#pragma unroll
      for (int i = 0; i < kUnits / sm90::kWarpgroupThreads; ++i)
        copy16_async(to + i * kRowsPerPass * Tile::kChunkBytes, from + i * pass_stride, true);
      return;
    }
#pragma unroll
    for (int i = 0; i < kUnits / sm90::kWarpgroupThreads; ++i) {
      const bool inside = row0 + i * kRowsPerPass < valid;
      copy16_async(to + i * kRowsPerPass * Tile::kChunkBytes, inside ? from + i * pass_stride : rows, inside);
    }
  } else {
    for (int unit = threadIdx.x; unit < kUnits; unit += sm90::kWarpgroupThreads) {
      const int row = unit / kUnitsPerRow, column = unit % kUnitsPerRow * 8;
      unsigned words[4] = {0, 0, 0, 0};
      if (row < valid) {
        const unsigned short *at = rows + row * strides.token + column;
#pragma unroll
        for (int w = 0; w < 4; ++w)
          words[w] = pack_f16x2(at[2 * w], at[2 * w + 1]);
      }
      *reinterpret_cast<uint4 *>(tile + Tile::offset(row, 2 * column)) =
          make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

// The dQ tile: [64 queries][D] f32 in shared memory with unpadded rows, so that a warp's 16 rows are one contiguous
// span, as they are in dQ (one bulk reduction per warp instead of one per row: the per-row reductions' serial issue
// loop was a fifth of the stall samples). It takes the current stage (Q and dO^s) once dK's and dV's wgmma have read
// it.
template <int D> __device__ __forceinline__ unsigned dq_tile_offset(int row, int column) {
  return row * (4 * D) + column * 4;
}

// scale x an m64n64 accumulator (channels channel0 .. channel0 + 63) into the dQ tile. Every row starts at bank 0 (4 D
// bytes, a multiple of 128), so a half warp's 64-bit stores of 4 rows at the same columns would hit the same 8 banks
// four times: lane (g, t) stores its column group j ^ (g % 4) at step j instead (the 4 rows of a half warp then fall
// into 4 distinct groups of 8 banks); the values move to match by two conditional swaps of register groups.
template <int D>
__device__ __forceinline__ void store_dq_chunk(unsigned tile, const float (&acc)[32], float scale, int channel0) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, x = g % 4;
  float v[32];
#pragma unroll
  for (int i = 0; i < 32; ++i)
    v[i] = acc[i] * scale;
    // v's group j := acc's group j ^ x (groups of 4: the accumulator's 8 columns of rows g and g + 8)
#pragma unroll
  for (int bit = 1; bit <= 2; bit *= 2) {
    const bool swap = (x & bit) != 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j & bit)
        continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float low = v[4 * j + e], high = v[4 * (j + bit) + e];
        v[4 * j + e] = swap ? high : low;
        v[4 * (j + bit) + e] = swap ? low : high;
      }
    }
  }
  const unsigned row0 = tile + dq_tile_offset<D>(16 * warp + g, channel0 + 2 * t);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      sm90::store_shared_pair(row0 + half * 8 * 4 * D + ((32 * j) ^ (32 * x)), v[4 * j + 2 * half],
                              v[4 * j + 2 * half + 1]);
}

// dQ[rows of the q block] += this warp's 16 rows of the dQ tile (written by this warp, fenced for the async proxy and
// synchronized within the warp): lane 0 reduces them, contiguous in dQ and in the tile, by one bulk reduction
// (cp.reduce.async.bulk .add.f32, up to 64 D bytes), so that the copy engine, not the threads, moves dQ; lane 0 later
// waits for its reads (sm90::bulk_wait_source_read) before the stage is rewritten. Without 16-byte alignment of dQ:
// scalar atomics from the tile, by every lane.
template <int D> __device__ __forceinline__ void reduce_dq_rows(float *dq, unsigned tile, int rows, bool vector) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  if (vector) {
    const int first = 16 * warp, count = min(16, rows - first);
    if (lane == 0 && count > 0)
      sm90::bulk_reduce_add_f32(dq + first * D, tile + dq_tile_offset<D>(first, 0), count * 4 * D);
    return;
  }
  for (int r = 0; r < 16; ++r) {
    const int row = 16 * warp + r;
    if (row >= rows)
      break;
    for (int c = lane; c < D; c += 32) {
      float value;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(value) : "r"(tile + dq_tile_offset<D>(row, c)) : "memory");
      atomicAdd(dq + row * D + c, value);
    }
  }
}

// rows[0 .. valid_keys) of an f32 [key][D] block += scale x an m64nD accumulator (element 4c + e: key 16 warp + g +
// 8 (e / 2), channel 8c + 2t + e % 2). Every load before any store, so that their latencies overlap (the compiler
// cannot move a load of dK past a store to dV, which may alias it: the first version's epilogue waited on each).
// `atomic` (the kv block's work is split over CTAs): by f32 reductions instead.
template <int D>
__device__ __forceinline__ void add_accumulator_rows(float *out, const float (&acc)[D / 2], float scale, int valid_keys,
                                                     bool atomic) {
  const int warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool pairs = reinterpret_cast<unsigned long long>(out) % 8 == 0;
  float *row_out[2] = {out + (16 * warp + g) * D + 2 * t, out + (16 * warp + g + 8) * D + 2 * t};
  const bool inside[2] = {16 * warp + g < valid_keys, 16 * warp + g + 8 < valid_keys};
  if (atomic) {
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (!inside[half])
          continue;
        float *at = row_out[half] + 8 * c;
        const float first = acc[4 * c + 2 * half] * scale, second = acc[4 * c + 2 * half + 1] * scale;
        if (pairs) {
          asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(at), "f"(first), "f"(second) : "memory");
        } else {
          atomicAdd(at, first);
          atomicAdd(at + 1, second);
        }
      }
    return;
  }
  float2 old[D / 8][2];
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float *at = row_out[half] + 8 * c;
      old[c][half] = !inside[half] ? make_float2(0.0f, 0.0f)
                                   : (pairs ? *reinterpret_cast<const float2 *>(at) : make_float2(at[0], at[1]));
    }
#pragma unroll
  for (int c = 0; c < D / 8; ++c)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      if (!inside[half])
        continue;
      float *at = row_out[half] + 8 * c;
      const float2 sum = make_float2(fmaf(acc[4 * c + 2 * half], scale, old[c][half].x),
                                     fmaf(acc[4 * c + 2 * half + 1], scale, old[c][half].y));
      if (pairs) {
        *reinterpret_cast<float2 *>(at) = sum;
      } else {
        at[0] = sum.x;
        at[1] = sum.y;
      }
    }
}

// Four 8 x 8 matrices of 16-bit elements from their mma fragments (register i: matrix i, row lane / 4, columns
// 2 (lane % 4), + 1) to shared memory, lane l giving the address of row l % 8 of matrix l / 8 (16 bytes each).
__device__ __forceinline__ void store_matrix_x4(unsigned address, const unsigned (&fragments)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(fragments[0]),
               "r"(fragments[1]), "r"(fragments[2]), "r"(fragments[3])
               : "memory");
}

// 16-bit A fragments (k steps of 16 columns) of an m64 accumulator: k step s is tiles 2s and 2s + 1.
template <int kColumns>
__device__ __forceinline__ void accumulator_fragments(unsigned (&a)[kColumns / 16][4], const float (&x)[kColumns / 2]) {
#pragma unroll
  for (int s = 0; s < kColumns / 16; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      a[s][i] = sm90::pack_f16x2(x[8 * s + 2 * i], x[8 * s + 2 * i + 1]);
}

// acc += A^T B over a q block's rows as one wgmma group, committed and left running: A^T's fragments (P^T or dS^T)
// in registers, B the q rows of `tile` (dO^s or Q), MN-major.
template <class L, int D, int kQuerySteps>
__device__ __forceinline__ void accumulate_over_queries(float (&acc)[D / 2], const unsigned (&a)[kQuerySteps][4],
                                                        unsigned tile) {
  sm90::warpgroup_fence_operands(acc);
  sm90::wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < kQuerySteps; ++ks)
    sm90::WgmmaF16RSF32<D>::run(acc, a[ks], mn_major_descriptor<typename L::RowTile>(L::kRowsMnFixed, tile, 16 * ks),
                                1);
  sm90::wgmma_commit_group();
  sm90::warpgroup_fence_operands(acc);
}

template <int D, int BLOCK_Q, int BLOCK_KV>
__device__ void sparse_fused_backward_wgmma(const SageSlaSparseBackwardParams &p) {
  using L = SparseFusedWgmmaLayout<D, BLOCK_Q, BLOCK_KV>;
  using RowTile = typename L::RowTile;
  using DsTile = typename L::DsTile;
  constexpr int kThreadsHere = sm90::kWarpgroupThreads, kQuerySteps = BLOCK_Q / 16, kKeySteps = BLOCK_KV / 16;
  constexpr float kLog2eHere = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  // Swizzle atoms need 1024-byte alignment: the base rounded up by an offset from the array itself (shared state
  // space accesses, as mask_gemm_sm90.cuh does).
  unsigned char *shared = shared_bytes + ((1024 - (shared_address(shared_bytes) & 1023)) & 1023);
  const unsigned base = shared_address(shared);
  float *stage_stats = reinterpret_cast<float *>(shared + L::kStats);
  if (static_cast<int>(blockIdx.x) >= *p.sparse_unit_count) // the grid bounds the units launch 4 listed
    return;
  const SparseUnit unit = sparse_unit(p.sparse_units, blockIdx.x, p.shape);
  const int b = unit.b, h_kv = unit.h_kv, j = unit.j;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int group = p.shape.heads_q / p.shape.heads_kv, q_blocks = p.shape.q_blocks;
  const int h_begin = h_kv * group, h_end = h_begin + group;
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  const int key_begin = j * BLOCK_KV, valid_keys = min(p.shape.tokens_kv, key_begin + BLOCK_KV) - key_begin;
  const long long tokens_q = p.shape.tokens_q;
  const SageSlaStrides do_strides{p.shape.heads_q * tokens_q * D, tokens_q * D, D}; // the f16 copy: contiguous

  // The work list, as the mma.sync kernel's: (q head h, n-th critical q block of the column), heads in order.
  const CriticalColumnList list{p.column_counts, p.critical_columns, b, p.shape.heads_q, p.shape.kv_blocks, j,
                                q_blocks};
  auto count_of = [&](int h) { return list.count(h); };
  auto block_of = [&](int h, int n) { return list.block(h, n); };
  // An item with its head's count and its q block, looked up one item ahead of its use (the lookups' latency then
  // hides behind an item's work instead of stalling the copies that need them); k: its ordinal in the unit.
  struct Item {
    int h, n, count, block, k;
  };
  auto advance = [&](Item &item) { // to the unit's next item, or h == h_end
    ++item.n;
    if (++item.k >= unit.items) {
      item.h = h_end;
      item.block = 0;
      return;
    }
    while (item.h < h_end && item.n >= item.count) {
      ++item.h;
      item.n = 0;
      item.count = item.h < h_end ? count_of(item.h) : 0;
    }
    item.block = item.h < h_end ? block_of(item.h, item.n) : 0;
  };
  // Q, dO^s, L and D^s of `item` into stage s: one group of copies. L past the q block is +inf (P = 0 there).
  auto issue = [&](const Item &item, int s) {
    if (item.h >= h_end)
      return;
    const int h = item.h;
    const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
    const int begin = item.block * BLOCK_Q, rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
    float *stats = stage_stats + s * 2 * BLOCK_Q;
    for (int r = threadIdx.x; r < 2 * BLOCK_Q; r += kThreadsHere) {
      const int row = r % BLOCK_Q;
      if (row < rows)
        copy_4_async(stats + r, (r < BLOCK_Q ? p.lse : p.delta) + head * tokens_q + begin + row);
      else
        stats[r] = r < BLOCK_Q ? __int_as_float(0x7f800000) : 0.0f;
    }
    unsigned char *q_tile = shared + L::kStages + s * L::kStageBytes;
    copy_rows_swizzled_f16<RowTile, BLOCK_Q, D>(q_tile, p.q, p.q_strides, b, h, begin, rows);
    copy_rows_swizzled_f16<RowTile, BLOCK_Q, D>(q_tile + RowTile::kBytes, p.d_sparse_f16, do_strides, b, h, begin,
                                                rows);
    commit_copies();
  };

  copy_rows_swizzled_f16<RowTile, BLOCK_KV, D>(shared + L::kK, p.k, p.k_strides, b, h_kv, key_begin, valid_keys);
  copy_rows_swizzled_f16<RowTile, BLOCK_KV, D>(shared + L::kV, p.v, p.v_strides, b, h_kv, key_begin, valid_keys);
  commit_copies();
  Item item{unit.h_first, unit.n_first - 1, count_of(unit.h_first), 0, -1};
  advance(item);
  issue(item, 0);
  Item next = item;
  advance(next);
  int stage = 0;

  const unsigned k_tile = base + L::kK, v_tile = base + L::kV, ds_tile = base + L::kDs;
  const float scale_log2 = p.scale * kLog2eHere;
  const bool dq_vector = reinterpret_cast<unsigned long long>(p.dq) % 16 == 0;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  while (item.h < h_end) {
    wait_copies<0>();               // this item's stage (and, the first time, K and V)
    sm90::fence_shared_for_wgmma(); // ... visible to wgmma
    __syncthreads();                // ... and to every warp; the previous item's wgmma (stage, dS^T) all retired
    const long long head = static_cast<long long>(b) * p.shape.heads_q + item.h;
    const int begin = item.block * BLOCK_Q, rows = min(p.shape.tokens_q, begin + BLOCK_Q) - begin;
    const unsigned q_tile = base + L::kStages + stage * L::kStageBytes, do_tile = q_tile + RowTile::kBytes;
    const float *lse = stage_stats + stage * 2 * BLOCK_Q, *delta = lse + BLOCK_Q;

    // S^T = K Q^T and dP^T = V dO^s^T as two groups
    float s[BLOCK_Q / 2], dp[BLOCK_Q / 2];
    sm90::warpgroup_fence_operands(s);
    sm90::warpgroup_fence_operands(dp);
    sm90::wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      sm90::WgmmaF16SS<BLOCK_Q>::run(s, RowTile::descriptor(k_tile, 32 * k), RowTile::descriptor(q_tile, 32 * k),
                                     k > 0);
    sm90::wgmma_commit_group();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      sm90::WgmmaF16SS<BLOCK_Q>::run(dp, RowTile::descriptor(v_tile, 32 * k), RowTile::descriptor(do_tile, 32 * k),
                                     k > 0);
    sm90::wgmma_commit_group();
    // The lookups of the item after the next one, while the groups run
    Item after = next;
    advance(after);
    sm90::wgmma_wait_group<1>();
    sm90::warpgroup_fence_operands(s);

    // P^T (element 4q + e: key 16 warp + g + 8 (e / 2), query 8q + 2t + e % 2), while dP^T's group runs
#pragma unroll
    for (int q = 0; q < BLOCK_Q / 8; ++q) {
      const float2 l = *reinterpret_cast<const float2 *>(lse + 8 * q + 2 * t);
      const float offset0 = -l.x * kLog2eHere, offset1 = -l.y * kLog2eHere;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[4 * q + e] = sm90::fast_exp2(fmaf(s[4 * q + e], scale_log2, e & 1 ? offset1 : offset0));
    }
    unsigned p_fragments[kQuerySteps][4], ds_fragments[kQuerySteps][4];
    accumulator_fragments<BLOCK_Q>(p_fragments, s);

    // dV += P^T dO^s (RS, B MN-major): its group runs while dS^T is computed
    accumulate_over_queries<L, D>(dv, p_fragments, do_tile);
    sm90::wgmma_wait_group<1>(); // dP^T's group
    sm90::warpgroup_fence_operands(dp);
    // dS^T = P^T o (dP^T - D^s), in place of dP^T
#pragma unroll
    for (int q = 0; q < BLOCK_Q / 8; ++q) {
      const float2 d = *reinterpret_cast<const float2 *>(delta + 8 * q + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        dp[4 * q + e] = s[4 * q + e] * (dp[4 * q + e] - (e & 1 ? d.y : d.x));
    }
    accumulator_fragments<BLOCK_Q>(ds_fragments, dp);

    // dS^T into shared memory ([key][query]) for dQ, before the fragments go to wgmma (a register an in-flight wgmma
    // reads may not be accessed): word i of k step s is key 16 warp + g + 8 (i % 2), queries 16s + 8 (i / 2) + 2t, + 1,
    // i.e. element (g, 2t) of the 8 x 8 matrix i of stmatrix .x4, whose rows lane l addresses: matrix l / 8, row l % 8
    // (key 16 warp + l % 8 + 8 (l / 8 % 2), queries from 16s + 8 (l / 16), one 16-byte unit of the swizzled tile).
    {
      const int key = 16 * warp + lane % 8 + 8 * (lane / 8 % 2), query = 8 * (lane / 16);
#pragma unroll
      for (int ks = 0; ks < kQuerySteps; ++ks)
        store_matrix_x4(ds_tile + DsTile::offset(key, 2 * (query + 16 * ks)), ds_fragments[ks]);
    }
    sm90::fence_shared_for_wgmma();

    // dK += dS^T Q (RS, B MN-major), left running
    accumulate_over_queries<L, D>(dk, ds_fragments, q_tile);
    sm90::bulk_wait_source_read(); // the previous item's dQ rows (this lane's bulk reduction) read from the other stage
    __syncthreads();               // every warp's rows of dS^T written (and fenced); the other stage free

    // dQ = dS K / sqrt(d), 64 channels per group: the first chunk's group runs with dV's and dK's (and is issued before
    // the next item's copies, so that the tensor cores have it meanwhile), the second (d = 128) is issued once they
    // have retired (their A fragments then free: the register budget).
    auto issue_dq = [&](float(&acc)[32], int chunk) {
      sm90::warpgroup_fence_operands(acc);
      sm90::wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kKeySteps; ++ks)
        sm90::WgmmaF16SSTransposedB<64, 1>::run(acc, mn_major_descriptor<DsTile>(L::kDsMnFixed, ds_tile, 16 * ks),
                                                mn_major_descriptor<RowTile>(L::kRowsMnFixed, k_tile, 16 * ks, chunk),
                                                ks > 0);
      sm90::wgmma_commit_group();
      sm90::warpgroup_fence_operands(acc);
    };
    float dq_first[32];
    issue_dq(dq_first, 0);
    // The next item's copies into the other stage: they land during the rest of this item
    issue(next, stage ^ 1);
    sm90::wgmma_wait_group<1>(); // dV's and dK's groups
    sm90::warpgroup_fence_operands(dv);
    sm90::warpgroup_fence_operands(dk);
#pragma unroll
    for (int ks = 0; ks < kQuerySteps; ++ks) {
      sm90::warpgroup_fence_operands(p_fragments[ks]);
      sm90::warpgroup_fence_operands(ds_fragments[ks]);
    }
    __syncthreads(); // every warp past dV and dK: the stage's Q and dO^s are free for the dQ tile
    if constexpr (D == 128) {
      float dq_second[32];
      issue_dq(dq_second, 1);
      sm90::wgmma_wait_group<1>();
      sm90::warpgroup_fence_operands(dq_first);
      store_dq_chunk<D>(q_tile, dq_first, p.scale, 0);
      sm90::wgmma_wait_group<0>();
      sm90::warpgroup_fence_operands(dq_second);
      store_dq_chunk<D>(q_tile, dq_second, p.scale, 64);
    } else {
      sm90::wgmma_wait_group<0>();
      sm90::warpgroup_fence_operands(dq_first);
      store_dq_chunk<D>(q_tile, dq_first, p.scale, 0);
    }
    sm90::fence_shared_for_wgmma(); // the dQ tile's rows, visible to the bulk copies (the async proxy)
    __syncwarp();                   // a warp reduces the rows it wrote
    reduce_dq_rows<D>(p.dq + (head * tokens_q + begin) * D, q_tile, rows, dq_vector);
    stage ^= 1;
    item = next;
    next = after;
  }
  wait_copies<0>();           // no copy outlives the CTA
  sm90::bulk_wait_complete(); // nor a bulk reduction

  // dK (x 1/sqrt(d): dS is the gradient of S / sqrt(d)) and dV added to the kv block's rows
  const long long block_rows = (head_kv * p.shape.tokens_kv + key_begin) * D;
  add_accumulator_rows<D>(p.dk + block_rows, dk, p.scale, valid_keys, unit.shared);
  add_accumulator_rows<D>(p.dv + block_rows, dv, 1.0f, valid_keys, unit.shared);
}

#endif // SAGE_SLA_SPARSE_FUSED_SM90

} // namespace sage::device::sla
