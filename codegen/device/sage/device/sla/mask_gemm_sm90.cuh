// The mask GEMMs on sm_90a's warpgroup MMAs (sla/mask_gemm.cuh says what they compute and why A's entries are exact).
// A CTA computes 128 output rows x 256 state columns at a time (several column tiles in turn): two warpgroups, each
// 64 rows x 256 columns (two m64n128k16 wgmma per 16 summed blocks, 128 f32 accumulators per thread), both operands
// from shared memory:
//   A (the built mask tile, [row][summed block], 128 x 64 f16 per k-step): K-major, 128-byte swizzle; each warpgroup
//     builds its own 64 rows (from the class bytes and the factor table) while its previous wgmma group runs, so A's
//     two buffers need no CTA-wide hand-over;
//   S (the states, [summed block][column], 64 x 256 f16 per k-step): MN-major (wgmma's transpose bit for 16-bit B),
//     four 128-byte column chunks with the 128-byte swizzle, as the sm90 forward's V; cp.async, kStages buffers,
//     kStages - 2 k-steps ahead.
// One CTA barrier per k-step: S's tile landed and A's tile written (each thread fences the async proxy first), and
// every warpgroup has retired the wgmma group of two steps back, whose S buffer the step's copies then overwrite.
// The class bytes of a step are loaded into registers one step ahead, so their L2 latency hides behind a step's MMAs.
#pragma once

#include "sage/device/sla/mask_gemm_support.cuh"
#include "sage/device/sm90/shared_tiles.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

// Whether this module's mask GEMM is the wgmma kernel (sm_90a) or mma.sync (every other arch).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SAGE_SLA_MASK_GEMM_SM90 1
#else
#define SAGE_SLA_MASK_GEMM_SM90 0
#endif

namespace sage::device::sla {

// CTAs per SM the mask GEMMs' launch bounds ask for: one with wgmma (128 accumulators per thread, ~200 KB of shared
// memory), two with mma.sync (128 registers, 80 KB).
constexpr int kMaskGemmMinBlocks = SAGE_SLA_MASK_GEMM_SM90 ? 1 : 2;

#if SAGE_SLA_MASK_GEMM_SM90

// The class runs of a thread's half row of A for one k-step. A row past the end reads row 0 (its entries are masked
// when A is built): no select right after the loads, whose consumers are a k-step later.
template <int kRuns> struct ClassRuns { ClassRun run[kRuns]; };

template <int kRuns>
__device__ __forceinline__ ClassRuns<kRuns> load_class_runs(const MaskGemmOperands &o, int row, int first) {
  ClassRuns<kRuns> runs;
#pragma unroll
  for (int r = 0; r < kRuns; ++r)
    runs.run[r] = load_classes(o, row < o.rows ? row : 0, first + 16 * r);
  return runs;
}

// The factors 2^(e_k - e_ref) of the summed blocks as f16 bits: from the shared table when depth <= the table's size,
// else computed from s_k.
struct MaskGemmFactors {
  const unsigned short *table; // in shared memory
  const float *scales;
  float reference;
  int depth;
  bool use_table; // depth <= the table's size
};

// e_ref from the largest s_k (e_ref = e_max - 15; the factors are exact quotients of powers of two), the factor table
// when depth <= kMaxTable, the tile's row flags cleared. Ends with a CTA barrier.
template <int kMaxTable, int kRows>
__device__ __forceinline__ MaskGemmFactors mask_gemm_factors(const MaskGemmOperands &o, unsigned short *table,
                                                             int *row_fallback, float *scratch) {
  float largest = 0.0f;
  for (int k = threadIdx.x; k < o.depth; k += kThreads)
    largest = fmaxf(largest, o.scales[k]);
  if (threadIdx.x < kRows)
    row_fallback[threadIdx.x] = 0;
  largest = block_reduce<true>(largest, scratch);
  MaskGemmFactors factors;
  factors.reference = largest > 0.0f ? ldexpf(largest, -kMaskGemmMaxReference) : 1.0f;
  factors.scales = o.scales;
  factors.table = table;
  factors.depth = o.depth;
  factors.use_table = o.depth <= kMaxTable;
  if (factors.use_table)
    for (int k = threadIdx.x; k < o.depth; k += kThreads)
      table[k] = gemm_factor(o.scales[k], factors.reference);
  __syncthreads();
  return factors;
}

// 16 entries of A (summed blocks first .. first + 15 of one row, first a multiple of 16) as 8 f16x2 words, without
// branches: the 16 factors (two 16-byte table reads; entries past the depth are garbage), each pair ANDed with the
// mask of its marginal classes (bytes spread to 16-bit lanes, compared with 0) and `row_mask` (0 for a row past the
// end). `out_of_range` is set where a marginal entry's factor is below f16's range (the row is flagged).
__device__ __forceinline__ void a_run_words(const ClassRun &run, unsigned row_mask, int first,
                                            const MaskGemmFactors &factors, unsigned (&words)[8], bool &out_of_range) {
  unsigned factor[8];
  if (factors.use_table) {
    const uint4 low = *reinterpret_cast<const uint4 *>(factors.table + first);
    const uint4 high = *reinterpret_cast<const uint4 *>(factors.table + first + 8);
    factor[0] = low.x, factor[1] = low.y, factor[2] = low.z, factor[3] = low.w;
    factor[4] = high.x, factor[5] = high.y, factor[6] = high.z, factor[7] = high.w;
  } else {
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const int k = min(first + 2 * w, factors.depth - 1), next = min(first + 2 * w + 1, factors.depth - 1);
      factor[w] = pack_f16x2(gemm_factor(__ldg(factors.scales + k), factors.reference),
                             gemm_factor(__ldg(factors.scales + next), factors.reference));
    }
  }
  unsigned zero_factors = 0;
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    // classes of entries 2w, 2w + 1 in the low bytes of two 16-bit lanes; marginal (0) lanes become 0xffff
    const unsigned pair = __byte_perm(run.word[w / 2], 0, w % 2 ? 0x4342 : 0x4140);
    const unsigned mask = __vcmpeq2(pair, 0) & row_mask;
    words[w] = factor[w] & mask;
    zero_factors |= __vcmpeq2(factor[w], 0) & mask;
  }
  out_of_range |= zero_factors != 0;
}

struct MaskGemmWgmmaTile {
  static constexpr int kM = SAGE_SLA_MASK_GEMM_ROWS, kN = SAGE_SLA_MASK_GEMM_WGMMA_COLUMNS;
  static constexpr int kK = SAGE_SLA_MASK_GEMM_DEPTH, kStages = SAGE_SLA_MASK_GEMM_WGMMA_STAGES;
  static constexpr int kAhead = kStages - 2; // k-steps of S in flight beyond the current one
  static constexpr int kMaxTable = SAGE_SLA_MASK_GEMM_TABLE;
  static constexpr int kWarpgroupRows = 64, kWgmmaColumns = 128;
  static constexpr int kRuns = kK / 32;         // 16-entry runs of A per thread and k-step (a thread: half a row)
  using ATile = sm90::SwizzledTile<kM, 2 * kK>; // [row][k], one 128-byte chunk (forward)
  using ATransposedTile = sm90::SwizzledTile<kK, 2 * kM>; // [k][row], a 128-byte chunk per warpgroup
  using STile = sm90::SwizzledTile<kK, 2 * kN>;           // four 128-byte column chunks
  static constexpr int kA = 0;                            // [2][ATile::kBytes]
  static constexpr int kS = kA + 2 * ATile::kBytes;       // [kStages][STile::kBytes]
  static constexpr int kTable = kS + kStages * STile::kBytes;
  static constexpr int kFlags = kTable + 2 * kMaxTable;
  static constexpr int kScratch = kFlags + 4 * kM;
  static constexpr int kDynamicBytes = kScratch + 4 * kWarps + 1024; // the base is rounded up to 1024 in-kernel
  static_assert(kM == 2 * kWarpgroupRows && kThreads == 2 * sm90::kWarpgroupThreads, "two warpgroups of 64 rows");
  static_assert(2 * kK == 128, "A's rows are one 128-byte swizzle chunk: one k-step");
  static_assert(kM * kK == kThreads * 16 * kRuns, "a thread builds kRuns runs of 16 entries of A per k-step");
  static_assert((kK * 2 * kN / 16) % kThreads == 0, "whole 16-byte pieces of S per thread");
  static_assert(ATile::kBytes % 1024 == 0 && STile::kBytes % 1024 == 0, "tiles at 1024-byte boundaries");
  static_assert(ATransposedTile::kBytes == ATile::kBytes && ATransposedTile::kChunkBytes == 2 * kWarpgroupRows,
                "A's layouts take the same buffers; a warpgroup's rows are one chunk of the transposed one");
  static_assert(kDynamicBytes == sage_sla_mask_gemm_shared_bytes(90),
                "abi.cuh's size of the mask GEMM's shared memory");
  static_assert(sage_sla_mask_gemm_columns(90) == kN, "abi.cuh's columns per CTA");
};

// blockIdx.x: the row tile; blockIdx.y: the first of the column tiles this CTA walks (gridDim.y apart: abi.cuh's
// sage_sla_mask_gemm_column_ctas), so that a tile's f32 stores drain while the next tile's copies and first steps run
// (a CTA's exit waits for its stores) and e_ref and the factor table are computed once per row tile.
// kTransposedA (the backward: class(r, k) at r + k * depth_stride, rows contiguous): A is built and read MN-major
// ([k][row], wgmma's transpose bit for A), so that a thread's run of 16 entries is 16 rows of one summed block, one
// 16-byte load of class bytes and one factor, as the forward's runs along k are.
template <int D, bool kTransposedA> __device__ void mask_gemm_wgmma(const MaskGemmOperands &o) {
  using T = MaskGemmWgmmaTile;
  static_assert((D * D) % T::kN == 0, "the columns split into whole tiles");
  constexpr int kColumnTiles = D * D / T::kN;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  // Swizzle atoms need 1024-byte alignment: the base rounded up by an offset from the array itself, so that the
  // compiler keeps every access below in the shared state space (st.shared / ld.shared, not generic).
  unsigned char *shared = shared_bytes + ((1024 - (shared_address(shared_bytes) & 1023)) & 1023);
  const unsigned shared_base = shared_address(shared);
  unsigned short *table = reinterpret_cast<unsigned short *>(shared + T::kTable);
  int *row_fallback = reinterpret_cast<int *>(shared + T::kFlags);
  float *scratch = reinterpret_cast<float *>(shared + T::kScratch);
  const int warpgroup = threadIdx.x / sm90::kWarpgroupThreads, depth = o.depth;
  const int first_row = blockIdx.x * T::kM;
  const int steps = (depth + T::kK - 1) / T::kK;
  int column_tile = blockIdx.y;

  // S's k-step `step` into its buffer: 16-byte pieces at their swizzled offsets, a thread's pieces 8 rows apart (the
  // same swizzle phase: offsets 1024 bytes apart); summed blocks past the end are zeros (0 * garbage could be NaN).
  // Always one commit group, empty past the last step, so that the waits count steps.
  constexpr int kPiecesPerRow = 2 * T::kN / 16, kCopyRows = kThreads / kPiecesPerRow;
  static_assert(kCopyRows == 8 && T::kK % kCopyRows == 0, "a thread's pieces are 8 rows (1024 bytes) apart");
  const int copy_row = threadIdx.x / kPiecesPerRow, copy_byte = threadIdx.x % kPiecesPerRow * 16;
  unsigned char *const copy_target = shared + T::kS + T::STile::offset(copy_row, copy_byte);
  const unsigned short *const thread_states = o.states + copy_row * static_cast<long long>(D * D) + copy_byte / 2;
  const unsigned short *copy_source = thread_states + column_tile * T::kN; // of the current column tile
  auto copy_states = [&](int step) {
    if (step < steps) {
      unsigned char *tile = copy_target + (step % T::kStages) * T::STile::kBytes;
      const unsigned short *source = copy_source + step * static_cast<long long>(T::kK * D * D);
#pragma unroll
      for (int i = 0; i < T::kK / kCopyRows; ++i) {
        const bool valid = step * T::kK + copy_row + kCopyRows * i < depth;
        copy16_async(tile + 8 * T::STile::kChunkBytes * i,
                     valid ? source + kCopyRows * i * static_cast<long long>(D * D) : thread_states, valid);
      }
    }
    commit_copies();
  };

  // A's entries of this thread per k-step: row a_row, summed blocks a_column + 16 r .. + 15 (forward); or summed block
  // a_k, rows a_rows + 16 r .. + 15 (kTransposedA). Either way only its own warpgroup's rows.
  const int a_row = threadIdx.x / 2, a_column = (threadIdx.x % 2) * (T::kK / 2);
  const int a_k = threadIdx.x % sm90::kWarpgroupThreads / 2,
            a_rows = T::kWarpgroupRows * warpgroup + (threadIdx.x % 2) * (T::kWarpgroupRows / 2);
  const unsigned row_mask = first_row + a_row < o.rows ? 0xffffffffu : 0u;
  MaskGemmOperands columns = o; // kTransposedA: M_c^T's view for load_classes (its rows: summed blocks)
  columns.row_stride = o.depth_stride;
  columns.depth_stride = o.row_stride;
  columns.depth = o.rows;
  auto load_row_classes = [&](int step) {
    if constexpr (kTransposedA) {
      const int k = step * T::kK + a_k;
      ClassRuns<T::kRuns> runs;
#pragma unroll
      for (int r = 0; r < T::kRuns; ++r) // rows past the end read as critical; a k past the end is masked
        runs.run[r] = load_classes(columns, k < depth ? k : 0, first_row + a_rows + 16 * r);
      return runs;
    } else {
      return load_class_runs<T::kRuns>(o, first_row + a_row, step * T::kK + a_column);
    }
  };

#pragma unroll
  for (int step = 0; step < T::kAhead; ++step)
    copy_states(step);
  ClassRuns<T::kRuns> next = load_row_classes(0);
  const MaskGemmFactors factors = mask_gemm_factors<T::kMaxTable, T::kM>(o, table, row_fallback, scratch);
  bool out_of_range = false;
  unsigned flagged_rows[T::kRuns] = {}; // kTransposedA: rows a_rows + 16 r + n with a marginal entry out of range
  auto store_a = [&](int step) {
    unsigned char *tile = shared + T::kA + (step & 1) * T::ATile::kBytes;
#pragma unroll
    for (int r = 0; r < T::kRuns; ++r) {
      unsigned words[8];
      int at;
      if constexpr (kTransposedA) {
        const int k = step * T::kK + a_k;
        const unsigned short factor =
            k >= depth
                ? 0
                : (factors.use_table ? factors.table[k] : gemm_factor(__ldg(factors.scales + k), factors.reference));
        const unsigned pair = k < depth ? factor * 0x10001u : 0u;
#pragma unroll
        for (int w = 0; w < 8; ++w)
          words[w] = pair & __vcmpeq2(__byte_perm(next.run[r].word[w / 2], 0, w % 2 ? 0x4342 : 0x4140), 0);
        if (factor == 0 && k < depth) // rare: a marginal block below f16's range flags its rows
#pragma unroll
          for (int n = 0; n < 16; ++n)
            flagged_rows[r] |= next.run[r].marginal(n) ? 1u << n : 0u;
        at = T::ATransposedTile::offset(a_k, 2 * (a_rows + 16 * r));
      } else {
        const int column = a_column + 16 * r;
        a_run_words(next.run[r], row_mask, step * T::kK + column, factors, words, out_of_range);
        at = T::ATile::offset(a_row, 2 * column);
      }
      *reinterpret_cast<uint4 *>(tile + at) = make_uint4(words[0], words[1], words[2], words[3]);
      *reinterpret_cast<uint4 *>(tile + (at ^ 16)) = make_uint4(words[4], words[5], words[6], words[7]);
    }
  };
  store_a(0);
  if (steps > 1)
    next = load_row_classes(1);

  // The MN-major S operand of k step s (16 summed blocks) and column half h: chunks 2h, 2h + 1 (LBO apart), the next
  // 8 summed blocks 8 rows x 128 bytes further (SBO).
  constexpr unsigned long long kSFixed =
      sm90::matrix_descriptor(0, T::STile::kChunkStride, 8 * T::STile::kChunkBytes, T::STile::kSwizzle);
  constexpr unsigned long long kATransposedFixed = sm90::matrix_descriptor(
      0, T::ATransposedTile::kChunkStride, 8 * T::ATransposedTile::kChunkBytes, T::ATransposedTile::kSwizzle);
  const int lane = threadIdx.x % 32, warp_row = T::kWarpgroupRows * warpgroup + 16 * (threadIdx.x / 32 % 4);
  float acc[2][64];
  while (column_tile < kColumnTiles) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 64; ++i)
        acc[h][i] = 0.0f;
    for (int step = 0; step < steps; ++step) {
      wait_copies<T::kAhead - 1>();   // this thread's pieces of S's tile `step`
      sm90::fence_shared_for_wgmma(); // ... and its entries of A's tile, visible to wgmma
      __syncthreads();                // every warpgroup has also retired step - 2's group: its S buffer is free
      copy_states(step + T::kAhead);

      const unsigned a_tile = shared_base + T::kA + (step & 1) * T::ATile::kBytes;
      const unsigned s_tile = shared_base + T::kS + (step % T::kStages) * T::STile::kBytes;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sm90::warpgroup_fence_operands(acc[h]);
      sm90::wgmma_fence();
#pragma unroll
      for (int s = 0; s < T::kK / 16; ++s) {
        // K-major A: 32 bytes of each row further per k step; MN-major A: the warpgroup's chunk, 16 k rows further.
        const unsigned long long a =
            kTransposedA ? kATransposedFixed |
                               static_cast<unsigned long long>((a_tile + warpgroup * T::ATransposedTile::kChunkStride +
                                                                s * 16 * T::ATransposedTile::kChunkBytes) >>
                                                               4)
                         : T::ATile::descriptor(a_tile, 32 * s, T::kWarpgroupRows * warpgroup);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const unsigned offset = 2 * h * T::STile::kChunkStride + s * 16 * T::STile::kChunkBytes;
          sm90::WgmmaF16SSTransposedB<128, kTransposedA>::run(
              acc[h], a, kSFixed | static_cast<unsigned long long>((s_tile + offset) >> 4), 1); // accumulate
        }
      }
      sm90::wgmma_commit_group();
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sm90::warpgroup_fence_operands(acc[h]);

      // While the group runs: A's next tile into the buffer of step - 1 (this warpgroup's rows, read only by its own
      // wgmma: retired once at most one group is pending), then the class bytes of the step after.
      if (step + 1 < steps) {
        sm90::wgmma_wait_group<1>();
        store_a(step + 1);
        if (step + 2 < steps)
          next = load_row_classes(step + 2);
      }
    }
    sm90::wgmma_wait_group<0>();
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sm90::warpgroup_fence_operands(acc[h]);

    // The next column tile's first copies before this tile's stores (the S buffers are free once both warpgroups have
    // retired their last group), so that its fill overlaps them. (Its class bytes are loaded after the stores: the
    // backward's strided byte loads would hold registers across them and spill.)
    const int first_column = column_tile * T::kN;
    column_tile += gridDim.y;
    const bool more = column_tile < kColumnTiles;
    __syncthreads();
    if (more) {
      copy_source = thread_states + column_tile * T::kN;
#pragma unroll
      for (int step = 0; step < T::kAhead; ++step)
        copy_states(step);
    }

    // out = acc 2^e_ref (exact). Accumulator element 4j + e of column half h: row 16 (warp % 4) + g + 8 (e / 2) of
    // the warpgroup's 64, column 128 h + 8 j + 2 t + e % 2; two consecutive columns per 8-byte store.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + warp_row + lane / 4 + 8 * half;
      if (row >= o.rows)
        continue;
      float *out = o.out + row * static_cast<long long>(D * D) + first_column + 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<float2 *>(out + T::kWgmmaColumns * h + 8 * j) = make_float2(
              acc[h][4 * j + 2 * half] * factors.reference, acc[h][4 * j + 2 * half + 1] * factors.reference);
    }
    if (more) {
      next = load_row_classes(0);
      store_a(0);
      if (steps > 1)
        next = load_row_classes(1);
    }
  }

  if constexpr (kTransposedA) {
#pragma unroll
    for (int r = 0; r < T::kRuns; ++r)
      for (int n = 0; n < 16; ++n)
        if (flagged_rows[r] >> n & 1)
          row_fallback[a_rows + 16 * r + n] = 1;
  } else if (out_of_range) {
    row_fallback[a_row] = 1;
  }
  __syncthreads(); // every thread's flag is in
  if (blockIdx.y == 0 && threadIdx.x < T::kM && first_row + static_cast<int>(threadIdx.x) < o.rows)
    o.fallback[first_row + threadIdx.x] = row_fallback[threadIdx.x];
}

#endif // SAGE_SLA_MASK_GEMM_SM90

} // namespace sage::device::sla
