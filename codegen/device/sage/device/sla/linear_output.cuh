// SLA's linear branch, Algorithm 1 lines 13 and 16, and the combined output O = O^s + Proj(O^l) (launch 4): per q
// block phi(Q_i) H_i / (phi(Q_i) Z_i) and O^l W^T + b on tensor cores with split f16 operands. H_i comes from the mask
// GEMM (mask_gemm.cuh) or, for the rows it flagged, from the listed states read 16 bytes at a time.
#pragma once

#include "sage/device/sla/linear_support.cuh"

namespace sage::device::sla {

// The output kernel's products: a warp's kTilesPerWarp 16 x 8 tiles (tile = warp + kWarps t of kTiles, kTileColumns
// tiles per row) of A B, A = rows in shared memory ([m][k]), both operands split in hi and lo (three products). When
// a row of tiles is kWarps wide, a warp's tiles share one column (m0 = 16 t, n0 = 8 warp): B's fragments are loaded
// once per k-step for all of them (10 ldmatrix per 12 mma instead of 16).
template <int K, bool kBKMajor, int kTiles, int kTilesPerWarp, int kTileColumns>
__device__ __forceinline__ void output_tiles_split(float (&c)[kTilesPerWarp][4], SharedF16 a_hi, SharedF16 a_lo,
                                                   SharedF16 b_hi, SharedF16 b_lo) {
  const int warp = threadIdx.x / 32;
  clear_tiles(c);
  if constexpr (kTileColumns == kWarps && kTiles == kWarps * kTilesPerWarp) {
    // Per k-step: B's fragments of the warp's column, A's of up to four tiles at a time, then each product over those
    // tiles in turn (no product waits on the one before it; a tile's sum keeps its order: lo hi, hi lo, hi hi; the
    // output kernel 955 -> 933 us at d = 128, N = 32k, h = 16 on an H100). ldmatrix addresses: the thread's offsets
    // plus constants.
    constexpr int kGroup = kTilesPerWarp % 4 == 0 ? 4 : kTilesPerWarp % 2 == 0 ? 2 : 1;
    const int lane = threadIdx.x % 32, n0 = 8 * warp;
    const int a_offset = ((lane & 8) + (lane & 7)) * a_hi.stride + (lane >> 4) * 8;
    const unsigned a_hi0 = shared_address(a_hi.base + a_offset), a_lo0 = shared_address(a_lo.base + a_offset);
    const int b_offset = kBKMajor ? (lane & 15) * b_hi.stride + n0 : (n0 + (lane & 7)) * b_hi.stride + (lane & 8);
    const unsigned b_hi0 = shared_address(b_hi.base + b_offset), b_lo0 = shared_address(b_lo.base + b_offset);
#pragma unroll 1
    for (int k0 = 0; k0 < K; k0 += 16) {
      const unsigned b_step = 2 * (kBKMajor ? k0 * b_hi.stride : k0);
      unsigned bh[2], bl[2];
      ldmatrix_x2<kBKMajor>(bh, b_hi0 + b_step);
      ldmatrix_x2<kBKMajor>(bl, b_lo0 + b_step);
#pragma unroll
      for (int g = 0; g < kTilesPerWarp; g += kGroup) {
        unsigned ah[kGroup][4], al[kGroup][4];
#pragma unroll
        for (int t = 0; t < kGroup; ++t) {
          const unsigned a_step = 2 * (16 * (g + t) * a_hi.stride + k0);
          ldmatrix_x4<false>(ah[t], a_hi0 + a_step);
          ldmatrix_x4<false>(al[t], a_lo0 + a_step);
        }
#pragma unroll
        for (int t = 0; t < kGroup; ++t)
          mma_f16(c[g + t], al[t], bh);
#pragma unroll
        for (int t = 0; t < kGroup; ++t)
          mma_f16(c[g + t], ah[t], bl);
#pragma unroll
        for (int t = 0; t < kGroup; ++t)
          mma_f16(c[g + t], ah[t], bh);
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

// CTAs per SM the output kernel's launch bounds ask for: three on sm_90 where three fit its shared memory (227 KB
// per SM; 72.5 KB each at d = 128, b_q = 64), which holds it to 80 registers per thread; else two (sm_100's ptxas
// spills at 80).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
constexpr bool kOutputWideSharedMemory = true;
#else
constexpr bool kOutputWideSharedMemory = false;
#endif
constexpr SAGE_SLA_HOST_DEVICE int output_min_blocks(int head_dim, int block_q) {
  return kOutputWideSharedMemory && 3 * (sage_sla_output_shared_bytes(head_dim, block_q) + 1024) <= 227 * 1024 ? 3 : 2;
}

// H_i's 16-byte pieces (8 consecutive elements of the row-major d x d matrix) in f32 in the mask GEMM's buffer, and
// for a row it flagged their sums over the listed h_j (with pre-aggregation: every h_j minus the listed ones, in that
// order), which the kernel writes over the GEMM's row.
template <int D> struct OutputStateReader {
  static constexpr int kVectors = D * D / 8;
  float *row; // H_i in the mask GEMM's buffer
  const uint4 *states;
  const float *scales;
  const int *lut;
  long long first_block; // of this kv head
  int listed, blocks;
  bool majority;

  // kCoherent: a plain load (a flagged row is written by its own CTA), else one through the read-only cache.
  template <bool kCoherent> __device__ void load(int piece, float (&x)[8]) const {
    const float4 *from = reinterpret_cast<const float4 *>(row + piece * 8);
    const float4 left = kCoherent ? from[0] : __ldg(from), right = kCoherent ? from[1] : __ldg(from + 1);
    x[0] = left.x, x[1] = left.y, x[2] = left.z, x[3] = left.w;
    x[4] = right.x, x[5] = right.y, x[6] = right.z, x[7] = right.w;
  }
  __device__ void store(int piece, const float (&x)[8]) const {
    float4 *to = reinterpret_cast<float4 *>(row + piece * 8);
    to[0] = make_float4(x[0], x[1], x[2], x[3]);
    to[1] = make_float4(x[4], x[5], x[6], x[7]);
  }
  __device__ void sum_listed(int piece, float (&x)[8]) const {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] = 0.0f;
    if (majority)
      for (int j = 0; j < blocks; ++j)
        accumulate_f16x8(x, __ldg(states + (first_block + j) * kVectors + piece), scales[first_block + j]);
    const float sign = majority ? -1.0f : 1.0f;
    for (int n = 0; n < listed; ++n) {
      const long long block = first_block + lut[n];
      accumulate_f16x8(x, __ldg(states + block * kVectors + piece), sign * scales[block]);
    }
  }
};

// Launch 4: one q block of one q head. H_i from the mask GEMM or, for the rows it flagged, the sum of the marginal
// h_j (or with pre-aggregation the sum of all minus the non-marginal ones), read twice (OutputStateReader): first for
// its largest magnitude, then a column slice per pass of phi(Q_i) H_i; O^l_r = phi(q_r) H_i / (phi(q_r) Z_i), 0 where
// the denominator is 0; O = O^s + O^l W^T + b. H_i is scaled by a power of two into f16's range before it is split (the
// ratio does not change). kBf16: Q, O^s and O are bf16; phi(Q) is split in f16 as in an f16 module (softmax's phi
// lies in [0, 1]; elu + 1 and relu take |Q| within f16's range, 65504).
template <int D, int BLOCK_Q, int PHI, bool kBf16> __device__ void linear_output(const SageSlaOutputParams &p) {
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

  // Q_i's rows, fetched first into the rows' lo buffer (as stored, kRowStride per row) so that their latency overlaps
  // H_i's and Z_i's: 16-byte asynchronous copies (zeros past the block's end), or plain loads where Q is not aligned.
  // Each thread later reads back only its own pieces (no barrier).
#pragma unroll
  for (int m = 0; m < kRowLoads; ++m) {
    const int piece = m * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
    if (piece >= kRowPieces)
      continue;
    unsigned short *to = rows_lo + r * L::kRowStride + c;
    const bool valid = begin + r < end;
    const long long from = valid ? element_index(p.q_strides, b, h, begin + r, c) : 0;
    if (q_vector)
      copy16_async(to, static_cast<const unsigned short *>(p.q) + from, valid);
    else
      *reinterpret_cast<uint4 *>(to) = valid ? load_f16x8(p.q, from, false) : make_uint4(0u, 0u, 0u, 0u);
  }
  commit_copies();

  // Line 13. H_i comes from the mask GEMM (launch 3c) unless it flagged this row; then, and for Z_i (d floats per
  // listed block), the lookup table: the marginal blocks, or with pre-aggregation (marginal blocks the majority) the
  // sum of all blocks minus the non-marginal ones (Z_i from z_total; a flagged row sums every h_j itself). H_i is
  // read twice (OutputStateReader): here for its largest magnitude only, later a slice per pass, so that it takes no
  // registers in between (output_min_blocks CTAs per SM instead of two).
  const int marginal = p.shape.kv_blocks - p.shape.critical_per_row - p.shape.negligible_per_row;
  const bool majority = p.marginal_majority != 0;
  const int listed = majority ? p.shape.kv_blocks - marginal : marginal;
  const int *lut = p.linear_lut + row * listed;
  const bool from_gemm = p.h_sum_fallback[row] == 0; // the same for the whole CTA
  const OutputStateReader<D> reader{p.h_sums + row * D * D,
                                    reinterpret_cast<const uint4 *>(p.h_states),
                                    p.h_scales,
                                    lut,
                                    head_kv * p.shape.kv_blocks,
                                    listed,
                                    p.shape.kv_blocks,
                                    majority};
  // The mask GEMM's H_i: all of a thread's loads in flight at once; a flagged row's sums (rare), written over the
  // GEMM's row (the same thread's pieces; the barriers below publish them to the CTA).
  float x[L::kVectorsPerThread][8], largest = 0.0f;
  if (from_gemm) {
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors)
        reader.load<false>(v * kThreads + threadIdx.x, x[v]);
#pragma unroll
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors)
#pragma unroll
        for (int e = 0; e < 8; ++e)
          largest = fmaxf(largest, fabsf(x[v][e]));
  } else {
    for (int v = 0; v < L::kVectorsPerThread; ++v)
      if (v * kThreads + threadIdx.x < L::kVectors) {
        float sum[8];
        reader.sum_listed(v * kThreads + threadIdx.x, sum);
        reader.store(v * kThreads + threadIdx.x, sum);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          largest = fmaxf(largest, fabsf(sum[e]));
      }
  }
  const float sign = majority ? -1.0f : 1.0f;
  // Scratch: the operands' buffers, free until the first pass.
  const float z_listed = sum_listed_vectors_x4<D>(p.z_states, head_kv * p.shape.kv_blocks, lut, listed,
                                                  reinterpret_cast<float *>(operand_hi));
  const float z = threadIdx.x < D ? (majority ? p.z_total[head_kv * D + threadIdx.x] : 0.0f) + sign * z_listed : 0.0f;
  if (threadIdx.x < D)
    z_state[threadIdx.x] = z;
  const float factor = f16_range_factor(block_reduce<true>(largest, scratch)); // also publishes z_state
  if (p.h_rows) { // kept for the backward (H_i itself per pass, below)
    if (threadIdx.x == 0)
      p.h_row_scales[row] = 1.0f / factor;
    if (threadIdx.x < D)
      p.z_rows[row * D + threadIdx.x] = z;
  }

  // Line 16's rows: phi(q_r) split into f16 hi + lo, and the denominator phi(q_r) Z_i in f32 (scaled as H_i is). A row
  // is kLanes consecutive lanes with 8 features each; a thread's pieces are those it fetched above.
  wait_all_copies();
#pragma unroll 1 // one piece at a time (registers)
  for (int m = 0; m < kRowLoads; ++m) {
    const int piece = m * kThreads + threadIdx.x, r = piece / kLanes, c = piece % kLanes * 8;
    if (piece >= kRowPieces) // the same for the whole warp (whole rows per warp)
      continue;
    const bool valid = begin + r < end;
    float x[8];
    unpack_x8<kBf16>(*reinterpret_cast<const uint4 *>(rows_lo + r * L::kRowStride + c), x);
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
    // H_i's slice for this pass (rows a, columns pass kColumns ..), its loads before the barrier; kept for the
    // backward in the states' format (h_rows: f16 of H_i times the factor, 16-byte pieces of 8 row-major elements).
    constexpr int kSliceLanes = L::kColumns / 8, kSlicePieces = D * kSliceLanes;
    constexpr int kSliceLoads = (kSlicePieces + kThreads - 1) / kThreads;
    float slice[kSliceLoads][8];
#pragma unroll
    for (int u = 0; u < kSliceLoads; ++u) {
      const int s = u * kThreads + threadIdx.x;
      if (s < kSlicePieces)
        reader.load<true>(s / kSliceLanes * (D / 8) + pass * kSliceLanes + s % kSliceLanes, slice[u]);
    }
    __syncthreads(); // phi(Q_i) is written; the previous pass's reads of the slice are done
#pragma unroll
    for (int u = 0; u < kSliceLoads; ++u) {
      const int s = u * kThreads + threadIdx.x, a = s / kSliceLanes, c = s % kSliceLanes * 8;
      if (s >= kSlicePieces)
        continue;
      store_split8_packed(slice[u], factor, operand_hi + a * L::kStateStride + c, operand_lo + a * L::kStateStride + c);
      if (p.h_rows) {
        unsigned words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
          words[w] = pack_f16x2_rn(slice[u][2 * w] * factor, slice[u][2 * w + 1] * factor);
        reinterpret_cast<uint4 *>(p.h_rows)[row * L::kVectors + a * (D / 8) + pass * kSliceLanes + s % kSliceLanes] =
            make_uint4(words[0], words[1], words[2], words[3]);
      }
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
      unpack_x8<kBf16>(bits[u], x);
      const float4 left = *reinterpret_cast<const float4 *>(staged + r * kStageStride + c);
      const float4 right = *reinterpret_cast<const float4 *>(staged + r * kStageStride + c + 4);
      x[0] += left.x, x[1] += left.y, x[2] += left.z, x[3] += left.w;
      x[4] += right.x, x[5] += right.y, x[6] += right.z, x[7] += right.w;
      store_f16x8(p.out, element_index(p.out_strides, b, h, begin + r, c), o_vector, pack_x8<kBf16>(x));
    }
  }
}

} // namespace sage::device::sla
