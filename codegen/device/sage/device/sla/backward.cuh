// SLA's backward (Algorithm 2) of the exact formula: the linear branch's kernels. Proj is its owner's to
// differentiate: these kernels take dO^s and dO^l. The linear branch reads the forward's H_i, Z_i (and totals) and
// lookup tables; the rows and kv kernels here write dQ, dK and dV, to which the sparse part's tensor-core kernels
// (sparse_backward.cuh: L and D^s recomputed over the critical blocks) add afterwards.
//
// The linear branch's products are small GEMMs per block on tensor cores (tensor_core.cuh: mma.sync m16n8k16, f16 in,
// f32 accumulate, f32 operands split in f16 hi + lo; their warp tiles in backward_tiles.cuh), SAGE_SLA_BACKWARD_CHUNK
// rows of a block at a time:
//   rows (q block i):  N = phi(Q) H_i, G = W H_i^T with W = dO^l / den, and dH_i += phi(Q)^T W;
//   kv (kv block j):   d phi(K) = V dh_j^T + dz_j, dV = phi(K) dh_j.
// Every f16 operand that is not exact carries a power-of-two scale into f16's range (H_i / s_i as the forward stored
// it, W per 32-row chunk, dh_j per kv block), undone in f32 afterwards: exact, whatever the gradients' magnitudes.
#pragma once

#include "sage/device/sla/backward_tiles.cuh"
#include "sage/device/sla/common.cuh"
#include "sage/device/sla/linear_support.cuh"
#include "sage/device/sla/mask_gemm.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

// The rows kernel's shared memory (abi.cuh's sage_sla_rows_backward_shared_bytes gives the host the same number).
template <int D, int BLOCK_Q> struct RowsBackwardLayout {
  static constexpr int kStride = BackwardTiles<D>::kStride;
  static constexpr int kStateHalves = D * kStride, kChunkHalves = kBackwardChunk * kStride;
  static constexpr int kPartials = 4 * kBackwardChunk; // one row-reduction buffer
  static_assert(BackwardTiles<D>::kChunkWarpsN <= 4, "a row-reduction buffer holds 4 column warps");
  static_assert(2 * (kStateHalves + 4 * kChunkHalves) + 4 * (2 * D + BLOCK_Q + 2 * kPartials + kWarps) ==
                    sage_sla_rows_backward_shared_bytes(D, BLOCK_Q),
                "abi.cuh's size of the rows kernel's shared memory");
};

// The kv kernel's shared memory (abi.cuh's sage_sla_kv_backward_shared_bytes).
template <int D> struct KvBackwardLayout {
  static constexpr int kStride = BackwardTiles<D>::kStride;
  static constexpr int kStateHalves = D * kStride, kChunkHalves = kBackwardChunk * kStride;
  static constexpr int kPartials = 4 * kBackwardChunk;
  static_assert(kChunkHalves * 2 >= kThreads * 4, "phi(K)'s hi part is sum_listed_vectors' scratch at first");
  static_assert(2 * (2 * kStateHalves + 3 * kChunkHalves) + 4 * (D + kPartials + kWarps) ==
                    sage_sla_kv_backward_shared_bytes(D),
                "abi.cuh's size of the kv kernel's shared memory");
};

// Launch 1: the column lookup tables, ascending in the q block, by warp-ballot compaction.
__device__ inline void column_tables(const SageSlaColumnsParams &p) {
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0)
    *p.sparse_unit_count = 0; // launch 4 counts from here
  if (threadIdx.x >= 32)
    return;
  const int b = blockIdx.z, h = blockIdx.y, j = blockIdx.x, lane = threadIdx.x;
  const int q_blocks = p.shape.q_blocks, kv_blocks = p.shape.kv_blocks;
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const long long column = head * kv_blocks + j;
  int counts[3] = {0, 0, 0};
  int *lists[3] = {p.critical_columns + column * q_blocks, p.marginal_columns + column * q_blocks,
                   p.non_marginal_columns + column * q_blocks};
  for (int base = 0; base < q_blocks; base += 32) {
    const int i = base + lane;
    const signed char cls = i < q_blocks ? p.classes[(head * q_blocks + i) * kv_blocks + j] : 2;
    const bool take[3] = {cls == 1, cls == 0, i < q_blocks && cls != 0};
    for (int list = 0; list < 3; ++list) {
      const unsigned ballot = __ballot_sync(0xffffffffu, take[list]);
      if (take[list])
        lists[list][counts[list] + __popc(ballot & ((1u << lane) - 1u))] = i;
      counts[list] += __popc(ballot);
    }
  }
  if (lane < 3)
    p.column_counts[column * 3 + lane] = counts[lane];
}

// Launch 2: one q block of one q head: the linear branch's dQ (written), dH_i and dZ_i (lines 4-5). With
// den_r = phi(q_r) Z_i, O^l_r = phi(q_r) H_i / den_r and D^l_r = <dO^l_r, O^l_r>:
//   d phi(q_r) = dO^l_r H_i^T / den_r - (D^l_r / den_r) Z_i,  dH_i = sum_r phi(q_r)^T dO^l_r / den_r,
//   dZ_i = -sum_r phi(q_r) D^l_r / den_r  (0 for rows with den_r = 0: O^l_r = 0 there by definition).
// On tensor cores with W = f dO^l / den (f: a power of two per chunk of rows that puts max |W| into f16's range) and
// H_i / s_i exact in f16: N = phi(Q) H_i / s_i, G = W H_i^T / s_i, so dO^l H_i^T / den = G s_i / f and
// D^l_r / den_r = s_i / (f den_r) <W_r, N_r>. dH_i's accumulators hold f dH_i: rescaled (exactly: powers of two) to
// each chunk's f before its product. kBf16: Q is bf16 (phi(Q) is split in f16 as in the forward's output kernel).
template <int D, int BLOCK_Q, int BLOCK_KV, int PHI, bool kBf16>
__device__ void rows_backward(const SageSlaRowsBackwardParams &p) {
  using T = BackwardTiles<D>;
  using L = RowsBackwardLayout<D, BLOCK_Q>;
  constexpr int kStride = T::kStride, kPerLane = (D + 31) / 32;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *h_bits = reinterpret_cast<unsigned short *>(shared_bytes);             // H_i / s_i [D][kStride]
  unsigned short *phi_hi = h_bits + L::kStateHalves, *phi_lo = phi_hi + L::kChunkHalves; // phi(Q) [chunk][kStride]
  unsigned short *w_hi = phi_lo + L::kChunkHalves, *w_lo = w_hi + L::kChunkHalves;       // W [chunk][kStride]
  float *z_state = reinterpret_cast<float *>(w_lo + L::kChunkHalves);
  float *dz_state = z_state + D;                        // dZ_i's running sum, one thread per feature
  float *inverse_denominator = dz_state + D;            // the chunk's 1 / den_r (0 where den_r = 0)
  float *ratio_partial = inverse_denominator + BLOCK_Q; // <W_r, N_r> per column warp
  float *inner_partial = ratio_partial + L::kPartials;  // softmax's <d phi, phi> per column warp
  float *scratch = inner_partial + L::kPartials;
  const int b = blockIdx.z, h = blockIdx.y, i = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
  const long long row_block = head * p.shape.q_blocks + i;
  const int begin = i * BLOCK_Q, end = min(p.shape.tokens_q, begin + BLOCK_Q);

  // H_i / s_i and Z_i as the forward kept them (line 13, with pre-aggregation).
  // H_i goes to shared memory asynchronously (cp.async) while the first chunk's rows load.
  const uint4 *h_source = reinterpret_cast<const uint4 *>(p.h_rows) + row_block * (D * D / 8);
  for (int piece = threadIdx.x; piece < D * D / 8; piece += kThreads)
    copy16_async(h_bits + (piece * 8 / D) * kStride + piece * 8 % D, h_source + piece, true);
  commit_copies();
  if (threadIdx.x < D)
    z_state[threadIdx.x] = p.z_rows[row_block * D + threadIdx.x];
  const float h_scale = p.h_row_scales[row_block];
  __syncthreads();

  float dh[T::kStateM][T::kStateN][4];
  clear_tiles(dh);
  if (threadIdx.x < D)
    dz_state[threadIdx.x] = 0.0f; // read and written by its own thread only
  const bool chunk_warp = T::chunk_warp();
  const int m0 = T::chunk_m0(), n0 = T::chunk_n0();
  const SharedF16 phi_hi_s{phi_hi, kStride}, phi_lo_s{phi_lo, kStride}, w_hi_s{w_hi, kStride}, w_lo_s{w_lo, kStride};
  const SharedF16 h_s{h_bits, kStride};
  // A warp's rows of a chunk (raw Q and dO^l), loaded one chunk ahead where one CTA runs per SM.
  constexpr bool kAhead = kRowsBackwardMinBlocks == 1;
  // The k-steps unrolled in N's and G's products and in dH_i's: all of them where one CTA runs per SM, else few (the
  // fragments loaded ahead of the unrolled steps would spill dH_i's accumulators at 128 registers).
  constexpr int kSteps = kAhead ? D / 16 : 2, kDhSteps = kAhead ? kBackwardChunk / 16 : 1;
  float x_next[kWarpRows][kPerLane], g_next[kWarpRows][kPerLane];
  auto load_chunk_rows = [&](int chunk) {
#pragma unroll
    for (int m = 0; m < kWarpRows; ++m) {
      const int r = warp + kWarps * m;
      const bool valid = chunk + r < end - begin;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        x_next[m][u] =
            valid && c < D ? load_element<kBf16>(p.q, element_index(p.q_strides, b, h, begin + chunk + r, c)) : 0.0f;
        g_next[m][u] = valid && c < D ? p.d_linear[(head * p.shape.tokens_q + begin + chunk + r) * D + c] : 0.0f;
      }
    }
  };
  if (kAhead)
    load_chunk_rows(0);
  float dh_factor = 0.0f; // the f of dH_i's accumulators (0: nothing accumulated yet)
  for (int chunk = 0; chunk < BLOCK_Q && begin + chunk < end; chunk += kBackwardChunk) {
    const int rows = min(kBackwardChunk, end - begin - chunk); // valid rows of the chunk
    if (!kAhead)
      load_chunk_rows(chunk);
    wait_all_copies(); // H_i (the first time): the barriers below publish it
    __syncthreads();   // the previous chunk's reads of phi(Q), W, 1 / den and the partial sums are done
    // phi(Q), den = phi(Q) Z_i and max |dO^l_r| / den_r over the chunk. Rows past the block's end stay 0 in phi(Q) and
    // W (phi(0) is not 0 for elu + 1).
    float inverse[kWarpRows], largest = 0.0f;
#pragma unroll
    for (int m = 0; m < kWarpRows; ++m) {
      const int r = warp + kWarps * m;
      const bool valid = r < rows;
      if (valid)
        feature_map_lanes<D, PHI>(x_next[m]);
      float dot = 0.0f, top = 0.0f;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        if (c >= D)
          continue;
        dot += x_next[m][u] * z_state[c];
        top = fmaxf(top, fabsf(g_next[m][u]));
        split_f16(x_next[m][u], phi_hi[r * kStride + c], phi_lo[r * kStride + c]);
      }
      dot = warp_sum(dot);
      top = warp_max(top);
      inverse[m] = valid && dot != 0.0f ? 1.0f / dot : 0.0f;
      largest = fmaxf(largest, top * fabsf(inverse[m]));
      if (lane == 0 && r < BLOCK_Q)
        inverse_denominator[r] = inverse[m];
    }
    // f for this chunk; dH_i's accumulators are rescaled to it below, by at most 2^64 up (no overflow: a chunk 2^64
    // times smaller than an earlier one only loses W's low bits, not dH_i's).
    float w_factor = f16_range_factor(block_reduce<true>(largest, scratch)); // also publishes 1 / den
    if (dh_factor > 0.0f)
      w_factor = fminf(w_factor, dh_factor * 0x1p64f);
#pragma unroll
    for (int m = 0; m < kWarpRows; ++m) {
      const int r = warp + kWarps * m;
      const float weight = w_factor * inverse[m];
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        if (c < D)
          split_f16(weight != 0.0f ? g_next[m][u] * weight : 0.0f, w_hi[r * kStride + c], w_lo[r * kStride + c]);
      }
    }
    __syncthreads();
    if (dh_factor != w_factor) { // exact: a power of two (the accumulators are 0 before the first chunk)
      const float rescale = dh_factor > 0.0f ? w_factor / dh_factor : 1.0f;
#pragma unroll
      for (int mi = 0; mi < T::kStateM; ++mi)
#pragma unroll
        for (int ni = 0; ni < T::kStateN; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            dh[mi][ni][e] *= rescale;
      dh_factor = w_factor;
    }
    const float g_to_gradient = h_scale / w_factor;
    if (kAhead && chunk + kBackwardChunk < BLOCK_Q && begin + chunk + kBackwardChunk < end)
      load_chunk_rows(chunk + kBackwardChunk); // in flight during the products below

    // dH_i += phi(Q)^T W: phi(Q) is [row][feature], A stored k-major; W [row][channel], B k-major. First, so that its
    // 64 accumulators are the only ones live with its fragments.
    if (T::state_warp())
      warp_tiles_mma<kBackwardChunk, T::kStateM, T::kStateN, true, true, true, true, kDhSteps>(
          dh, phi_hi_s, phi_lo_s, w_hi_s, w_lo_s, T::state_m0(), T::state_n0());
    // N = phi(Q) H_i / s_i (H_i is [feature][channel]: k-major B), reduced to <W_r, N_r> at once; then
    // G = W (H_i / s_i)^T ([n][k]).
    float gradient[1][T::kChunkN][4];
    clear_tiles(gradient);
    if (chunk_warp) {
      float numerator[1][T::kChunkN][4];
      clear_tiles(numerator);
      warp_tiles_mma<D, 1, T::kChunkN, false, true, true, false, kSteps>(numerator, phi_hi_s, phi_lo_s, h_s, h_s, m0,
                                                                         n0);
#pragma unroll
      for (int ni = 0; ni < T::kChunkN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          numerator[0][ni][e] *= split_value(w_hi, w_lo, chunk_row(m0, e) * kStride + chunk_column(n0, ni, e));
      chunk_row_partials<T::kChunkN>(numerator[0], m0, T::chunk_column_warp(), ratio_partial);
      warp_tiles_mma<D, 1, T::kChunkN, false, false, true, false, kSteps>(gradient, w_hi_s, w_lo_s, h_s, h_s, m0, n0);
    }
    __syncthreads(); // the partial sums are written

    // u_r = D^l_r / den_r; dZ_i -= sum_r phi(q_r) u_r.
    auto ratio = [&](int r) {
      return r < rows ? chunk_row_total<T::kChunkWarpsN>(ratio_partial, r) * (g_to_gradient * inverse_denominator[r])
                      : 0.0f;
    };
    if (threadIdx.x < D) {
      float sum = 0.0f;
#pragma unroll 8
      for (int r = 0; r < rows; ++r)
        sum += split_value(phi_hi, phi_lo, r * kStride + threadIdx.x) * ratio(r);
      dz_state[threadIdx.x] -= sum;
    }
    // d phi(q_r) = G_r s_i / f - u_r Z_i, then dQ through phi.
    const float row_ratio[2] = {ratio(chunk_row(m0, 0)), ratio(chunk_row(m0, 2))}; // the lane's two rows
    float d_phi[T::kChunkN][4];
#pragma unroll
    for (int ni = 0; ni < T::kChunkN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        d_phi[ni][e] = chunk_warp
                           ? gradient[0][ni][e] * g_to_gradient - row_ratio[e >> 1] * z_state[chunk_column(n0, ni, e)]
                           : 0.0f;
    chunk_feature_map_backward<D, PHI, T::kChunkN>(d_phi, phi_hi, phi_lo, chunk_warp, inner_partial);
    if (chunk_warp)
      store_chunk_rows<D, T::kChunkN, kAhead>(d_phi, p.dq + (head * p.shape.tokens_q + begin + chunk) * D, rows);
  }

  // dH_i in f16 with a power-of-two scale (as the states): half the bytes the mask GEMM sums per q block.
  const float top = largest_magnitude(dh);
  // Staged in H_i's buffer (free: block_reduce's barriers follow every read of it), then stored 16 bytes per thread
  // (the fragments' 4-byte pieces would write half of each 32-byte sector per store).
  const float factor = f16_range_factor(block_reduce<true>(top, scratch));
  if (T::state_warp()) {
#pragma unroll
    for (int mi = 0; mi < T::kStateM; ++mi)
#pragma unroll
      for (int ni = 0; ni < T::kStateN; ++ni) {
        const int row = T::state_m0() + 16 * mi + tile_row(), col = T::state_n0() + 8 * ni + tile_col();
        *reinterpret_cast<unsigned *>(h_bits + row * kStride + col) =
            pack_f16x2(f16_bits(dh[mi][ni][0] * factor), f16_bits(dh[mi][ni][1] * factor));
        *reinterpret_cast<unsigned *>(h_bits + (row + 8) * kStride + col) =
            pack_f16x2(f16_bits(dh[mi][ni][2] * factor), f16_bits(dh[mi][ni][3] * factor));
      }
  }
  __syncthreads();
  uint4 *out = reinterpret_cast<uint4 *>(p.dh_rows + row_block * D * D);
  for (int piece = threadIdx.x; piece < D * D / 8; piece += kThreads)
    out[piece] = *reinterpret_cast<const uint4 *>(h_bits + (piece * 8 / D) * kStride + piece * 8 % D);
  if (threadIdx.x == 0)
    p.dh_scales[row_block] = 1.0f / (factor * dh_factor); // exact: powers of two
  if (threadIdx.x < D)
    p.dz_rows[row_block * D + threadIdx.x] = dz_state[threadIdx.x];
}

// Launch 3: sum_i dZ_i per q head, 32 channels per CTA: warp w sums the q blocks w, w + kWarps, ... (coalesced, 16
// loads in flight per lane), then lane c adds the warps' sums in order (one CTA per head ran 27 us at N = 32k: a lane's
// 512 dependent adds, 16 CTAs).
template <int D> __device__ void row_totals(const SageSlaRowTotalsParams &p) {
  __shared__ float partial[kWarps][32];
  const long long head = static_cast<long long>(blockIdx.z) * p.shape.heads_q + blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, c = blockIdx.x * 32 + lane;
  float sum = 0.0f;
  if (c < D) {
#pragma unroll 16
    for (int i = warp; i < p.shape.q_blocks; i += kWarps)
      sum += p.dz_rows[(head * p.shape.q_blocks + i) * D + c];
  }
  partial[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < D) {
    float total = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      total += partial[w][lane];
    p.dz_total[head * D + c] = total;
  }
}

// Launch 4: one kv block of one kv head. dh_j = sum of dH_i over the q blocks (of every q head of the GQA group)
// where the block is marginal, from the mask GEMM (launch 3c; for a column it flagged, from the column tables, all
// minus the others when marginal blocks are the column's majority), then d phi(K_t) = dh_j V_t + dz_j and dV_t =
// phi(K_t) dh_j (line 17), written; the sparse part's kv kernel adds to them, in the work units listed here (one
// thread per CTA, from the column tables). On tensor cores: dh_j / s (s a power of two into f16's range) split in hi +
// lo; V is exact in f16, phi(K) is split. kBf16: K and V are bf16, and these products run on bf16 operands (V exact,
// dh_j and phi(K) split in bf16 hi + lo: tensor_core.cuh).
template <int D, int BLOCK_Q, int BLOCK_KV, int PHI, bool kBf16>
__device__ void columns_backward(const SageSlaColumnsBackwardParams &p) {
  using T = BackwardTiles<D>;
  using L = KvBackwardLayout<D>;
  constexpr int kStride = T::kStride, kPerLane = (D + 31) / 32;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  unsigned short *dh_hi = reinterpret_cast<unsigned short *>(shared_bytes), *dh_lo = dh_hi + L::kStateHalves;
  unsigned short *k_hi = dh_lo + L::kStateHalves, *k_lo = k_hi + L::kChunkHalves; // phi(K) [chunk][kStride]
  unsigned short *v_bits = k_lo + L::kChunkHalves;                                // V [chunk][kStride]
  float *dz_state = reinterpret_cast<float *>(v_bits + L::kChunkHalves);
  float *inner_partial = dz_state + D; // softmax's <d phi, phi> per column warp
  float *scratch = inner_partial + L::kPartials;
  const int b = blockIdx.z, h_kv = blockIdx.y, j = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = p.shape.heads_q / p.shape.heads_kv;
  const int q_blocks = p.shape.q_blocks;
  const long long head_kv = static_cast<long long>(b) * p.shape.heads_kv + h_kv;
  if (threadIdx.x == 0) // the fused sparse backward's units of this kv block (launch 1 wrote the counts)
    list_sparse_units(p.column_counts, p.sparse_units, p.sparse_unit_count, p.sparse_unit_items, p.shape, b, h_kv, j);

  float unscale = 1.0f; // dh_j = s (hi + lo)
  {
    float dz = 0.0f, factor = 1.0f;
    float *list_scratch = reinterpret_cast<float *>(k_hi); // free until the first chunk
    // A q head's column of M_c: the q blocks where block j is marginal, or with pre-aggregation (marginal blocks the
    // majority) the others, subtracted from the head's totals.
    struct Column {
      const int *list;
      int listed;
      bool majority;
    };
    auto column_of = [&](long long head) {
      const long long column = head * p.shape.kv_blocks + j;
      const int marginal = p.column_counts[column * 3 + 1], non_marginal = p.column_counts[column * 3 + 2];
      const bool majority = 2 * marginal > q_blocks;
      return Column{(majority ? p.non_marginal_columns : p.marginal_columns) + column * q_blocks,
                    majority ? non_marginal : marginal, majority};
    };
    // dh_j from the mask GEMM unless it flagged this column; dz_j (d floats per listed q block) from the tables.
    const long long kv_column = head_kv * p.shape.kv_blocks + j;
    const bool from_gemm = p.dh_sums && p.dh_sum_fallback[kv_column] == 0; // the same for the whole CTA
    if (from_gemm) {
      // In coalesced 16-byte pieces (a warp's load covers 512 consecutive bytes), piece n kThreads + thread.
      constexpr int kPieces = D * D / 4, kPiecesPerThread = (kPieces + kThreads - 1) / kThreads;
      const float4 *source = reinterpret_cast<const float4 *>(p.dh_sums + kv_column * D * D);
      float4 pieces[kPiecesPerThread];
      float largest = 0.0f;
#pragma unroll
      for (int n = 0; n < kPiecesPerThread; ++n) {
        const int piece = n * kThreads + threadIdx.x;
        pieces[n] = piece < kPieces ? __ldg(source + piece) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        largest = fmaxf(largest, fmaxf(fmaxf(fabsf(pieces[n].x), fabsf(pieces[n].y)),
                                       fmaxf(fabsf(pieces[n].z), fabsf(pieces[n].w))));
      }
      factor = f16_range_factor(block_reduce<true>(largest, scratch));
#pragma unroll
      for (int n = 0; n < kPiecesPerThread; ++n) {
        const int piece = n * kThreads + threadIdx.x;
        if (piece >= kPieces)
          continue;
        const int at = (piece * 4 / D) * kStride + piece * 4 % D;
        const float values[4] = {pieces[n].x, pieces[n].y, pieces[n].z, pieces[n].w};
        unsigned short hi[4], lo[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          split_element<kBf16>(values[e] * factor, hi[e], lo[e]);
        *reinterpret_cast<uint2 *>(dh_hi + at) = make_uint2(pack_f16x2(hi[0], hi[1]), pack_f16x2(hi[2], hi[3]));
        *reinterpret_cast<uint2 *>(dh_lo + at) = make_uint2(pack_f16x2(lo[0], lo[1]), pack_f16x2(lo[2], lo[3]));
      }
      for (int h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
        const Column column = column_of(head);
        if (column.majority && threadIdx.x < D)
          dz += p.dz_total[head * D + threadIdx.x];
        dz += (column.majority ? -1.0f : 1.0f) *
              sum_listed_vectors<D>(p.dz_rows, head * q_blocks, column.list, column.listed, list_scratch);
      }
    } else {
      using Sum = ScaledStateSum<D>;
      float dh[Sum::kVectorsPerThread][8];
      Sum::clear(dh);
      for (int h = h_kv * group; h < (h_kv + 1) * group; ++h) {
        const long long head = static_cast<long long>(b) * p.shape.heads_q + h;
        const Column column = column_of(head);
        const float sign = column.majority ? -1.0f : 1.0f;
        if (column.majority && threadIdx.x < D)
          dz += p.dz_total[head * D + threadIdx.x];
        if (column.majority) // a flagged column (rare): every dH_i of the head, minus the listed ones below
          for (int i = 0; i < q_blocks; ++i)
            Sum::add_one(dh, p.dh_rows, p.dh_scales, head * q_blocks + i);
        Sum::add_listed(dh, p.dh_rows, p.dh_scales, head * q_blocks, column.list, column.listed, sign,
                        [&](long long row_block) {
                          if (threadIdx.x < D)
                            dz += sign * p.dz_rows[row_block * D + threadIdx.x];
                        });
      }
      factor = f16_range_factor(block_reduce<true>(largest_magnitude(dh), scratch));
#pragma unroll
      for (int v = 0; v < Sum::kVectorsPerThread; ++v)
        if (Sum::owns(v)) {
          const int at = (Sum::first_element(v) / D) * kStride + Sum::first_element(v) % D;
          store_split8<kBf16>(dh[v], factor, dh_hi + at, dh_lo + at);
        }
    }
    unscale = 1.0f / factor;
    if (threadIdx.x < D)
      dz_state[threadIdx.x] = dz;
  }

  const bool chunk_warp = T::chunk_warp();
  const int m0 = T::chunk_m0(), n0 = T::chunk_n0();
  const SharedF16 dh_hi_s{dh_hi, kStride}, dh_lo_s{dh_lo, kStride}, k_hi_s{k_hi, kStride}, k_lo_s{k_lo, kStride};
  const SharedF16 v_s{v_bits, kStride};
  const int begin = j * BLOCK_KV, end = min(p.shape.tokens_kv, begin + BLOCK_KV);
  for (int chunk = 0; chunk < BLOCK_KV && begin + chunk < end; chunk += kBackwardChunk) {
    const int rows = min(kBackwardChunk, end - begin - chunk);
    __syncthreads(); // dh_j is stored; the previous chunk's reads of phi(K), V and the partial sums are done
    // Rows past the block's end stay 0 in phi(K) and V. A warp's rows load at once.
    float x[kWarpRows][kPerLane];
    unsigned short v_row[kWarpRows][kPerLane];
#pragma unroll
    for (int m = 0; m < kWarpRows; ++m) {
      const int r = warp + kWarps * m;
      const bool valid = r < rows;
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        x[m][u] =
            valid && c < D ? load_element<kBf16>(p.k, element_index(p.k_strides, b, h_kv, begin + chunk + r, c)) : 0.0f;
        v_row[m][u] =
            valid && c < D
                ? static_cast<const unsigned short *>(p.v)[element_index(p.v_strides, b, h_kv, begin + chunk + r, c)]
                : 0;
      }
    }
#pragma unroll
    for (int m = 0; m < kWarpRows; ++m) {
      const int r = warp + kWarps * m;
      if (r < rows)
        feature_map_lanes<D, PHI>(x[m]);
#pragma unroll
      for (int u = 0; u < kPerLane; ++u) {
        const int c = lane + 32 * u;
        if (c >= D)
          continue;
        split_element<kBf16>(x[m][u], k_hi[r * kStride + c], k_lo[r * kStride + c]);
        v_bits[r * kStride + c] = v_row[m][u];
      }
    }
    __syncthreads();

    // d phi(K) = V dh_j^T + dz_j (dh_j [feature][channel] is B^T: [n][k]), then dK through phi; then dV = phi(K) dh_j
    // (k-major B): one set of accumulators live at a time.
    float d_phi[1][T::kChunkN][4];
    clear_tiles(d_phi);
    if (chunk_warp) {
      warp_tiles_mma<D, 1, T::kChunkN, false, false, false, true, D / 16, kBf16>(d_phi, v_s, v_s, dh_hi_s, dh_lo_s, m0,
                                                                                 n0);
#pragma unroll
      for (int ni = 0; ni < T::kChunkN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          d_phi[0][ni][e] = d_phi[0][ni][e] * unscale + dz_state[chunk_column(n0, ni, e)];
    }
    chunk_feature_map_backward<D, PHI, T::kChunkN, kBf16>(d_phi[0], k_hi, k_lo, chunk_warp, inner_partial);
    if (chunk_warp) {
      // Softmax's backward leaves less room: its dK goes 8 bytes per lane (128 registers on sm_90, no spills).
      store_chunk_rows<D, T::kChunkN, PHI != kPhiSoftmax>(
          d_phi[0], p.dk + (head_kv * p.shape.tokens_kv + begin + chunk) * D, rows);
      float dv[1][T::kChunkN][4];
      clear_tiles(dv);
      warp_tiles_mma<D, 1, T::kChunkN, false, true, true, true, D / 16, kBf16>(dv, k_hi_s, k_lo_s, dh_hi_s, dh_lo_s, m0,
                                                                               n0);
#pragma unroll
      for (int ni = 0; ni < T::kChunkN; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          dv[0][ni][e] *= unscale;
      store_chunk_rows<D, T::kChunkN>(dv[0], p.dv + (head_kv * p.shape.tokens_kv + begin + chunk) * D, rows);
    }
  }
}

} // namespace sage::device::sla
