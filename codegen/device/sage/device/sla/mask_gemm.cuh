// SLA's linear-branch sums as GEMMs with the class mask on tensor cores (f16 in, f32 accumulate): mma.sync m16n8k16
// here, warpgroup MMAs on sm_90a (sla/mask_gemm_sm90.cuh).
// Forward, per (batch, q head): H = A S with A[i][j] = m_ij 2^(e_j - e_ref) (m_ij = 1 where block (i, j) is marginal)
// and S the stack of the f16 states h_j / s_j (s_j = 2^e_j, one row of d * d columns per kv block). Each 32 x 128
// tile of S loaded once serves 128 q blocks, instead of every q block reading its ~77 listed 32 KB states from L2 (20
// GB at N = 32k, 95%). Backward, per (batch, kv head): dh = A^T dS over the dH_i of the GQA group's q heads, the same
// kernel with the mask read transposed.
//
// Why f16 with power-of-two entries: A's entries are exact powers of two, so every product A_ij S_jc is exact in the
// f32 accumulator and the result carries what the f32 register sum of the scaled f16 matrices did. e_ref = e_max - 15
// per GEMM puts the largest entry at 2^15; f16 holds powers of two down to 2^-24 (subnormal, still exact), so blocks
// within 39 binades of the largest scale are exact. A marginal block below that (its matrix is < 2^-38 of the largest
// one's maximum) would be dropped: its output row is flagged instead and the consumer (the output kernel, the
// backward's kv kernel) sums that row from the lookup tables as before, so no row loses a block silently.
#pragma once

#include "sage/device/sla/mask_gemm_sm90.cuh"
#include "sage/device/sla/mask_gemm_support.cuh"

namespace sage::device::sla {

// The mma.sync CTA tile: 128 output rows x 128 state columns, 64 summed blocks per k-step (double-buffered: one L2
// round trip per k-step is exposed at most, and 64 blocks of mma work cover most of it); 8 warps as 4 (rows) x 2
// (columns), each 32 x 64 (2 x 8 mma tiles, 64 f32 accumulators). Shared memory (dynamic: abi.cuh's
// sage_sla_mask_gemm_shared_bytes): A's and S's tiles twice, the factors of the summed blocks, the rows' flags, a
// reduction scratch.
struct MaskGemmTile {
  static constexpr int kM = SAGE_SLA_MASK_GEMM_ROWS, kN = SAGE_SLA_MASK_GEMM_COLUMNS, kK = SAGE_SLA_MASK_GEMM_DEPTH;
  static constexpr int kAStride = kK + 8, kBStride = kN + 8; // padded rows: ldmatrix without bank conflicts
  static constexpr int kWarpRows = 32, kWarpColumns = 64;
  static constexpr int kMmaRows = kWarpRows / 16, kMmaColumns = kWarpColumns / 8;
  static constexpr int kMaxTable = SAGE_SLA_MASK_GEMM_TABLE; // summed blocks whose factors are kept in shared memory
  static constexpr int kRuns = kK / 32;                      // 16-entry runs of A per thread and k-step
  static constexpr int kATileHalves = kM * kAStride, kSTileHalves = kK * kBStride;
  static_assert((kM / kWarpRows) * (kN / kWarpColumns) == kWarps, "one warp tile per warp");
  static_assert(kM * kK == kThreads * 16 * kRuns, "a thread builds kRuns runs of 16 entries of A per k-step");
  static_assert((kK * kN / 8) % kThreads == 0, "whole 16-byte pieces of S per thread");
  static_assert(2 * (2 * kATileHalves + 2 * kSTileHalves + kMaxTable) + 4 * (kM + kWarps) ==
                    sage_sla_mask_gemm_shared_bytes(80),
                "abi.cuh's size of the mask GEMM's shared memory");
};

// 128 output rows x 128 of the d * d columns per CTA (blockIdx.x: the row tile, blockIdx.y: the column tile; row tiles
// vary fastest, so the CTAs that share a tile of S run together and read it from L2 once).
template <int D> __device__ void mask_gemm_mma(const MaskGemmOperands &o) {
  using T = MaskGemmTile;
  static_assert((D * D) % T::kN == 0, "the columns split into whole tiles");
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *a_tiles = reinterpret_cast<unsigned short *>(shared_bytes); // [2][kATileHalves]
  unsigned short *s_tiles = a_tiles + 2 * T::kATileHalves;                    // [2][kSTileHalves]
  unsigned short *column_factor = s_tiles + 2 * T::kSTileHalves;             // gemm_factor(s_k) when depth <= kMaxTable
  int *row_fallback = reinterpret_cast<int *>(column_factor + T::kMaxTable); // [kM]
  float *scratch = reinterpret_cast<float *>(row_fallback + T::kM);          // [kWarps]
  const int warp = threadIdx.x / 32, rows = o.rows, depth = o.depth;
  const int first_row = blockIdx.x * T::kM, first_column = blockIdx.y * T::kN;
  const bool table = depth <= T::kMaxTable;

  // e_ref from the largest s_k; the factors 2^(e_k - e_ref) are exact quotients of powers of two.
  float largest = 0.0f;
  for (int k = threadIdx.x; k < depth; k += kThreads)
    largest = fmaxf(largest, o.scales[k]);
  if (threadIdx.x < T::kM)
    row_fallback[threadIdx.x] = 0;
  largest = block_reduce<true>(largest, scratch);
  const float reference = largest > 0.0f ? ldexpf(largest, -kMaskGemmMaxReference) : 1.0f;
  if (table)
    for (int k = threadIdx.x; k < depth; k += kThreads)
      column_factor[k] = gemm_factor(o.scales[k], reference);

  // A's entries of this thread: row a_row, summed blocks k0 + a_column + 16 r .. + 15 for r < kRuns.
  const int a_row = threadIdx.x / 2, a_column = (threadIdx.x % 2) * (T::kK / 2);
  const bool row_valid = first_row + a_row < rows;
  const unsigned short *states = o.states + first_column;
  auto copy_states = [&](int k0, int buffer) {
#pragma unroll
    for (int piece = threadIdx.x; piece < T::kK * T::kN / 8; piece += kThreads) {
      const int r = piece / (T::kN / 8), c = (piece % (T::kN / 8)) * 8, k = k0 + r;
      const bool valid = k < depth; // rows past the end are zeros: 0 * garbage could be NaN
      copy16_async(&s_tiles[buffer * T::kSTileHalves + r * T::kBStride + c],
                   states + (valid ? k : 0) * static_cast<long long>(D * D) + c, valid);
    }
    commit_copies();
  };
  struct Runs {
    ClassRun run[T::kRuns];
  };
  auto load_row_classes = [&](int k0) {
    Runs runs;
#pragma unroll
    for (int r = 0; r < T::kRuns; ++r) {
      runs.run[r] = load_classes(o, row_valid ? first_row + a_row : 0, k0 + a_column + 16 * r);
      if (!row_valid) {
#pragma unroll
        for (int w = 0; w < 4; ++w)
          runs.run[r].word[w] = 0x01010101u; // critical: no marginal entries
      }
    }
    return runs;
  };
  auto store_a = [&](const Runs &runs, int k0, int buffer) {
    bool out_of_range = false;
#pragma unroll
    for (int r = 0; r < T::kRuns; ++r) {
      unsigned words[8];
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        unsigned short halves[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int n = 2 * w + e, k = k0 + a_column + 16 * r + n;
          const bool marginal = runs.run[r].marginal(n);
          halves[e] = !marginal ? 0 : table ? column_factor[k] : gemm_factor(__ldg(o.scales + k), reference);
          out_of_range |= marginal && halves[e] == 0;
        }
        words[w] = pack_f16x2(halves[0], halves[1]);
      }
      uint4 *at =
          reinterpret_cast<uint4 *>(&a_tiles[buffer * T::kATileHalves + a_row * T::kAStride + a_column + 16 * r]);
      at[0] = make_uint4(words[0], words[1], words[2], words[3]);
      at[1] = make_uint4(words[4], words[5], words[6], words[7]);
    }
    if (out_of_range)
      row_fallback[a_row] = 1;
  };

  float acc[T::kMmaRows][T::kMmaColumns][4];
  clear_tiles(acc);

  const int steps = (depth + T::kK - 1) / T::kK;
  copy_states(0, 0);
  __syncthreads(); // column_factor is written
  store_a(load_row_classes(0), 0, 0);
  const int warp_row = (warp / 2) * T::kWarpRows, warp_column = (warp % 2) * T::kWarpColumns;
  for (int step = 0; step < steps; ++step) {
    const int buffer = step & 1;
    wait_all_copies();
    __syncthreads(); // tile `step` is in shared memory; every read of the other buffer (step - 1) is done
    const bool more = step + 1 < steps;
    Runs next{};
    if (more) {
      copy_states((step + 1) * T::kK, buffer ^ 1);
      next = load_row_classes((step + 1) * T::kK);
    }
    const SharedF16 a{a_tiles + buffer * T::kATileHalves, T::kAStride},
        s{s_tiles + buffer * T::kSTileHalves, T::kBStride};
#pragma unroll
    for (int k = 0; k < T::kK; k += 16) {
      unsigned a_fragments[T::kMmaRows][4];
#pragma unroll
      for (int m = 0; m < T::kMmaRows; ++m)
        load_a<false>(a_fragments[m], a, warp_row + 16 * m, k);
#pragma unroll
      for (int n = 0; n < T::kMmaColumns; ++n) {
        unsigned b_fragment[2];
        load_b<true>(b_fragment, s, k, warp_column + 8 * n); // S's tile is [summed block][column]: k-major
#pragma unroll
        for (int m = 0; m < T::kMmaRows; ++m)
          mma_f16(acc[m][n], a_fragments[m], b_fragment);
      }
    }
    if (more)
      store_a(next, (step + 1) * T::kK, buffer ^ 1);
  }

  // out = acc 2^e_ref: exact (a power of two). Two consecutive columns per 8-byte store.
#pragma unroll
  for (int m = 0; m < T::kMmaRows; ++m)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + warp_row + 16 * m + tile_row() + 8 * half;
      if (row >= rows)
        continue;
      float *out = o.out + row * static_cast<long long>(D * D) + first_column + warp_column;
#pragma unroll
      for (int n = 0; n < T::kMmaColumns; ++n)
        *reinterpret_cast<float2 *>(out + 8 * n + tile_col()) =
            make_float2(acc[m][n][2 * half] * reference, acc[m][n][2 * half + 1] * reference);
    }
  __syncthreads(); // every store_a's flag is in
  if (blockIdx.y == 0 && threadIdx.x < T::kM && first_row + static_cast<int>(threadIdx.x) < rows)
    o.fallback[first_row + threadIdx.x] = row_fallback[threadIdx.x];
}

// The mask GEMM of the module's arch: warpgroup MMAs on sm_90a (256 columns per CTA), mma.sync elsewhere (128); both
// run 256 threads over 128 rows, so only the grid's column tiles and the shared memory differ (abi.cuh).
// kTransposed: the backward's (row_stride 1: the mask read transposed).
template <int D, bool kTransposed> __device__ void mask_gemm(const MaskGemmOperands &o) {
#if SAGE_SLA_MASK_GEMM_SM90
  mask_gemm_wgmma<D, kTransposed>(o);
#else
#if defined(__CUDA_ARCH__)
  static_assert(!sage_sla_mask_gemm_wgmma(__CUDA_ARCH__ / 10), "abi.cuh sizes this arch's launch for wgmma");
#endif
  mask_gemm_mma<D>(o);
#endif
}

// Launch 3c: H_i = sum over the marginal j of h_j for one q head. Grid (ceil(q_blocks / 128), d * d / columns
// (abi.cuh's sage_sla_mask_gemm_columns), batch * heads_q).
template <int D> __device__ void forward_mask_gemm(const SageSlaMaskGemmParams &p) {
  const long long head_q = blockIdx.z;
  const long long head_kv =
      (head_q / p.shape.heads_q) * p.shape.heads_kv + (head_q % p.shape.heads_q) / (p.shape.heads_q / p.shape.heads_kv);
  const int q_blocks = p.shape.q_blocks, kv_blocks = p.shape.kv_blocks;
  MaskGemmOperands o;
  o.classes = p.classes + head_q * q_blocks * kv_blocks;
  o.row_stride = kv_blocks;
  o.depth_stride = 1;
  o.states = p.h_states + head_kv * kv_blocks * D * D;
  o.scales = p.h_scales + head_kv * kv_blocks;
  o.out = p.h_sums + head_q * q_blocks * D * D;
  o.fallback = p.h_sum_fallback + head_q * q_blocks;
  o.rows = q_blocks;
  o.depth = kv_blocks;
  mask_gemm<D, false>(o);
}

// Backward launch 3c: dh_j = sum over the GQA group's q heads and their q blocks i where (i, j) is marginal of dH_i,
// for one kv head (the group's q heads are consecutive, so their dH_i are one stack). Grid (ceil(kv_blocks / 128),
// d * d / columns, batch * heads_kv).
template <int D> __device__ void backward_mask_gemm(const SageSlaMaskGemmColumnsParams &p) {
  const long long head_kv = blockIdx.z, group = p.shape.heads_q / p.shape.heads_kv;
  const long long first_head_q = (head_kv / p.shape.heads_kv) * p.shape.heads_q + (head_kv % p.shape.heads_kv) * group;
  const int q_blocks = p.shape.q_blocks, kv_blocks = p.shape.kv_blocks;
  MaskGemmOperands o;
  o.classes = p.classes + first_head_q * q_blocks * kv_blocks;
  o.row_stride = 1;
  o.depth_stride = kv_blocks;
  o.states = p.dh_rows + first_head_q * q_blocks * D * D;
  o.scales = p.dh_scales + first_head_q * q_blocks;
  o.out = p.dh_sums + head_kv * kv_blocks * D * D;
  o.fallback = p.dh_sum_fallback + head_kv * kv_blocks;
  o.rows = kv_blocks;
  o.depth = static_cast<int>(group * q_blocks);
  mask_gemm<D, true>(o);
}

} // namespace sage::device::sla
