// The parameter blocks of SLA's kernels (issue 13). Plain C, like codegen's KernelAbi.h: the device headers include
// it and the host includes the same file (codegen/device is on sage_codegen's include path), so both sides agree on
// the layout by construction. Pointers, ints, 64-bit strides (in elements; the head-dim stride is 1).
#ifndef SAGE_SLA_ABI_CUH
#define SAGE_SLA_ABI_CUH

struct SageSlaStrides {
  long long batch, head, token;
};

struct SageSlaShape {
  int batch, heads_q, heads_kv, tokens_q, tokens_kv;
  int q_blocks, kv_blocks;                  // ceil(tokens / block)
  int critical_per_row, negligible_per_row; // sage::criticalBlocksPerRow / negligibleBlocksPerRow
};

// Launch 1 of the mask prediction: the mean of every Q block and K block. Grid (q_blocks + kv_blocks, heads_q,
// batch).
struct SageSlaPoolParams {
  const void *q, *k; // f16, or bf16 in a bf16 module (every such tensor below)
  struct SageSlaStrides q_strides, k_strides;
  struct SageSlaShape shape;
  float *pooled_q; // [batch, heads_q, q_blocks, d]
  float *pooled_k; // [batch, heads_kv, d, kv_blocks]: transposed, for the prediction's coalesced reads
  // The workspace's flag for the backward, or 0: CTA (0, 0, 0) stores lse_saved_value there, 1 where this forward has
  // its sparse part write L into the backward's lse region and leaves O^s unchanged (SageSlaSparseDeltaParams), else 0.
  int *lse_saved;
  int lse_saved_value;
};

// Launch 2: P_c, M_c and the lookup tables, sage_sla_predict_rows(kv_blocks) rows of P_c (consecutive q blocks of one
// head) per CTA. Grid (ceil(q_blocks / rows), heads_q, batch).
struct SageSlaPredictParams {
  const float *pooled_q, *pooled_k;
  struct SageSlaShape shape;
  float scale;                  // 1/sqrt(d)
  float *compressed;            // P_c [batch, heads_q, q_blocks, kv_blocks]
  signed char *classes;         // M_c: 1 critical, 0 marginal, -1 negligible, same order
  unsigned char *critical_mask; // 1 where critical: the block mask of the sparse part, same order
  int *critical_lut;            // per row, its critical kv blocks ascending (critical_per_row of kv_blocks slots)
  int *linear_lut;              // per row, ascending: the marginal blocks, or the non-marginal ones when
                                // marginal_majority (pre-aggregation: H_i = sum of all h_j minus these)
  int marginal_majority;
};

// Launch 3: h_j = phi(K_j)^T V_j and z_j = colsum(phi(K_j)) per kv block, on tensor cores. Grid (kv_blocks, heads_kv,
// batch). h_j is stored in f16 (half the bytes the output kernel reads per listed block) as h_j / s_j, with s_j a power
// of two that puts max |h_j / s_j| in [2^14, 2^15): no overflow whatever the inputs' range, 11 significant bits.
struct SageSlaStateParams {
  const void *k, *v; // f16 / bf16
  struct SageSlaStrides k_strides, v_strides;
  struct SageSlaShape shape;
  unsigned short *h_states; // f16 bits of h_j / s_j, [batch, heads_kv, kv_blocks, d, d]
  float *h_scales;          // s_j, [batch, heads_kv, kv_blocks]
  float *z_states;          // [batch, heads_kv, kv_blocks, d]
};

// Launch 3b (pre-aggregation only): the sum of z_j over all kv blocks, in block order (deterministic).
// Grid (1, heads_kv, batch).
struct SageSlaTotalsParams {
  const float *z_states;
  struct SageSlaShape shape;
  float *z_total; // [batch, heads_kv, d]
};

// Launch 3c: H_i = sum over the marginal j of h_j for every q block at once, a GEMM of the class mask and the states
// on tensor cores (sla/mask_gemm.cuh says how the scales stay exact). Grid (ceil(q_blocks / 128), d * d / 128,
// batch * heads_q).
struct SageSlaMaskGemmParams {
  const signed char *classes; // M_c (SageSlaPredictParams)
  const unsigned short *h_states;
  const float *h_scales;
  struct SageSlaShape shape;
  float *h_sums;       // H_i in f32 [batch, heads_q, q_blocks, d, d]
  int *h_sum_fallback; // [batch, heads_q, q_blocks]: 1 where a marginal h_j is out of the GEMM's range (the output
                       // kernel sums that row from the lookup table instead), else 0
};

// Launch 4: H_i (the mask GEMM's, or summed from the lookup table), Z_i from the lookup table,
// O^l = phi(Q_i) H_i / (phi(Q_i) Z_i), O = O^s + O^l W^T + b.
// Grid (q_blocks, heads_q, batch); dynamic shared memory: sage_sla_output_shared_bytes(d, block_q).
struct SageSlaOutputParams {
  const void *q; // f16 / bf16
  struct SageSlaStrides q_strides;
  const unsigned short *h_states;
  const float *h_scales, *z_states, *z_total;
  const int *linear_lut;
  int marginal_majority;
  float *h_sums;             // the mask GEMM's H_i (required): the kernel writes the flagged rows' sums there
  const int *h_sum_fallback; // rows the GEMM flagged (SageSlaMaskGemmParams)
  const void *o_sparse;      // f16 / bf16 O^s (the block-sparse attention's output)
  struct SageSlaStrides o_sparse_strides;
  const float *proj_weight; // [d, d] row-major (out, in): torch.nn.Linear's weight; 0: O^s is left as it is
  const float *proj_bias;   // [d], or 0
  struct SageSlaShape shape;
  float *o_linear; // O^l [batch, heads_q, tokens_q, d] (f32, kept for the backward), or 0
  void *out;       // f16 / bf16 O; may alias o_sparse
  struct SageSlaStrides out_strides;
  // H_i, Z_i kept for the backward (which reads one matrix per q block instead of summing the listed h_j), or 0:
  // f16 bits of H_i / s_i [batch, heads_q, q_blocks, d, d] with s_i a power of two, and Z_i in f32.
  unsigned short *h_rows;
  float *h_row_scales; // s_i [batch, heads_q, q_blocks]
  float *z_rows;       // [batch, heads_q, q_blocks, d]
};

// ---- The backward (Algorithm 2). The caller's Proj is differentiated by its owner (torch.nn.Linear): these kernels
// take dO^s (= dO) and dO^l (= dO W) and return dQ, dK, dV of the exact formula, in f32.

// Backward launch 1: per column of M_c, the q blocks where it is critical, marginal or neither (ascending), and
// their counts. Grid (kv_blocks, heads_q, batch).
struct SageSlaColumnsParams {
  const signed char *classes; // M_c [batch, heads_q, q_blocks, kv_blocks]
  struct SageSlaShape shape;
  int *critical_columns;     // [batch, heads_q, kv_blocks, q_blocks]
  int *marginal_columns;     // same
  int *non_marginal_columns; // same
  int *column_counts;        // [batch, heads_q, kv_blocks, 3]: critical, marginal, non-marginal
  int *sparse_unit_count;    // CTA (0, 0, 0) zeroes it: launch 4 counts the work units of 4c there
};

// Backward launch 2: one q block of one q head: the linear branch's dQ (written), dH_i, dZ_i. Grid (q_blocks,
// heads_q, batch); dynamic shared memory: sage_sla_rows_backward_shared_bytes. (The sparse part's fields q, k, v,
// d_sparse, lse, delta are the statistics kernel's too: SageSlaSparseBackwardParams.)
struct SageSlaRowsBackwardParams {
  const void *q, *k, *v; // f16 / bf16
  struct SageSlaStrides q_strides, k_strides, v_strides;
  const float *d_sparse, *d_linear; // dO^s and dO^l, [batch, heads_q, tokens_q, d] f32
  const int *critical_lut;          // the forward's
  const unsigned short *h_rows;     // H_i, Z_i as the forward kept them (SageSlaOutputParams)
  const float *h_row_scales, *z_rows;
  struct SageSlaShape shape;
  float scale;             // 1/sqrt(d)
  float *lse;              // [batch, heads_q, tokens_q]
  float *delta;            // D^s, same
  float *dq;               // [batch, heads_q, tokens_q, d]
  unsigned short *dh_rows; // f16 bits of dH_i / s_i [batch, heads_q, q_blocks, d, d] (s_i: a power of two, as h_j's)
  float *dh_scales;        // s_i [batch, heads_q, q_blocks]
  float *dz_rows;          // dZ_i [batch, heads_q, q_blocks, d]
};

// Backward launch 3: sum_i dZ_i per q head (for columns whose marginal blocks are the majority). Grid (ceil(d / 32),
// heads_q, batch).
struct SageSlaRowTotalsParams {
  const float *dz_rows;
  struct SageSlaShape shape;
  float *dz_total; // [batch, heads_q, d]
};

// Backward launch 3c: dh_j = sum over the GQA group's q heads and q blocks i where (i, j) is marginal of dH_i, for
// every kv block at once: the mask GEMM with M_c^T (sla/mask_gemm.cuh). Grid (ceil(kv_blocks / 128), d * d / 128,
// batch * heads_kv).
struct SageSlaMaskGemmColumnsParams {
  const signed char *classes; // M_c
  const unsigned short *dh_rows;
  const float *dh_scales;
  struct SageSlaShape shape;
  float *dh_sums;       // dh_j in f32 [batch, heads_kv, kv_blocks, d, d]
  int *dh_sum_fallback; // [batch, heads_kv, kv_blocks]: 1 where the kv kernel sums the column's dH_i itself
};

// Backward launch 4: one kv block of one kv head: the linear branch's dK, dV (written) over the q heads of its GQA
// group. Grid (kv_blocks, heads_kv, batch); dynamic shared memory: sage_sla_kv_backward_shared_bytes. The sparse
// part's statistics (2c) and fused (4c) kernels take SageSlaSparseBackwardParams.
struct SageSlaColumnsBackwardParams {
  const void *q, *k, *v; // f16 / bf16
  struct SageSlaStrides q_strides, k_strides, v_strides;
  const float *d_sparse; // dO^s
  const float *lse, *delta;
  const unsigned short *dh_rows;
  const float *dh_scales, *dz_rows, *dz_total;
  const float *dh_sums;       // the mask GEMM's dh_j (SageSlaMaskGemmColumnsParams)
  const int *dh_sum_fallback; // the columns it flagged: their dh_j is summed from the column tables
  const int *critical_columns, *marginal_columns, *non_marginal_columns, *column_counts;
  struct SageSlaShape shape;
  float scale;
  float *dk, *dv; // [batch, heads_kv, tokens_kv, d]
  // 4c's work units (SageSlaSparseBackwardParams.sparse_units): each CTA appends its kv block's, counted in
  // sparse_unit_count (zeroed by launch 1), of at most sparse_unit_items critical pairs each.
  int *sparse_units, *sparse_unit_count;
  int sparse_unit_items;
};

// Backward launches 2c and 4c, the sparse part (they replaced a rows and a kv kernel that computed P three times per
// critical pair; here once). 2c, one q block of one q head: L and D^s over its critical blocks (written
// to lse, delta) and dO^s as f16 (d_sparse_f16). Grid (q_blocks, heads_q, batch), 2 * block_q threads; dynamic shared
// memory: sage_sla_sparse_backward_shared_bytes. 4c, one kv block of one kv head over the critical q blocks of the
// q heads of its GQA group, in work units (sparse_units): dK, dV added (plain where the unit is the kv block's only
// one, else by atomic adds), dQ added by f32 reductions. Grid (sage_sla_sparse_unit_capacity, 1, 1), 2 * block_kv
// threads; dynamic shared memory: sage_sla_sparse_fused_module_shared_bytes (the arch's kernel).
struct SageSlaSparseBackwardParams {
  const void *q, *k, *v; // f16 / bf16
  struct SageSlaStrides q_strides, k_strides, v_strides;
  const float *d_sparse;                       // dO^s [batch, heads_q, tokens_q, d] f32 (2c)
  unsigned short *d_sparse_f16;                // f16 (bf16) bits of dO^s, same layout: 2c writes, 4c reads
  const int *critical_lut;                     // the forward's (2c)
  const int *critical_columns, *column_counts; // the column tables (4c)
  struct SageSlaShape shape;
  float scale;    // 1/sqrt(d)
  float *lse;     // [batch, heads_q, tokens_q]: 2c writes, 4c reads
  float *delta;   // D^s, same
  float *dq;      // [batch, heads_q, tokens_q, d]: 4c adds
  float *dk, *dv; // [batch, heads_kv, tokens_kv, d]: 4c adds
  // 2c returns at once where this is non-null and *lse_saved != 0: the forward saved L and launch 2d wrote D^s and
  // dO^s in f16 instead. Null: 2c runs (the statistics recomputed).
  const int *lse_saved;
  // 4c's work units, as launch 4 listed them (*sparse_unit_count of them; 4c's CTA u takes unit u): four ints each,
  // kv column ((b heads_kv + h_kv) kv_blocks + j), first q head, first item of that head's column, item count
  // (negated where the kv block has more than one unit: their dK and dV go by atomic adds).
  const int *sparse_units, *sparse_unit_count;
};

// Backward launch 2d, where the forward saved the sparse part's L (FlashAttention's way): D^s = rowsum(dO^s o O^s)
// from the forward's O^s, and dO^s as f16 for 4c; it returns at once where *lse_saved == 0 (then 2c computes L, D^s
// and dO^s). Grid (q_blocks, heads_q, batch), 256 threads, no dynamic shared memory.
struct SageSlaSparseDeltaParams {
  const float *d_sparse; // dO^s [batch, heads_q, tokens_q, d] f32
  const void *o_sparse;  // f16 / bf16 O^s as the forward wrote it (SageSlaOutputParams.o_sparse)
  struct SageSlaStrides o_sparse_strides;
  const int *lse_saved; // SageSlaPoolParams.lse_saved
  struct SageSlaShape shape;
  float *delta;                 // D^s [batch, heads_q, tokens_q]
  unsigned short *d_sparse_f16; // f16 (bf16) bits of dO^s, as 2c writes them
};

#ifdef __CUDACC__
#define SAGE_SLA_HOST_DEVICE __host__ __device__
#else
#define SAGE_SLA_HOST_DEVICE
#endif
#ifdef __cplusplus
#define SAGE_SLA_CONSTEXPR constexpr
#else
#define SAGE_SLA_CONSTEXPR
#endif

// The prediction's CTA keeps the logits of its rows in shared memory: rows x kv_blocks of at most this many, with rows
// a power of two from 16 down to 2 (kv_blocks <= 4096).
#define SAGE_SLA_PREDICT_KEYS 8192
#define SAGE_SLA_PREDICT_MAX_ROWS 16
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_predict_rows(int kv_blocks) {
  int rows = SAGE_SLA_PREDICT_MAX_ROWS;
  while (rows > 2 && rows * kv_blocks > SAGE_SLA_PREDICT_KEYS)
    rows /= 2;
  return rows;
}

// The output kernel's dynamic shared memory: a d x min(d, 64) column slice of H_i (or min(d, 64) rows of Proj's
// weight) and the q block's rows of phi(Q) (then O^l), each as f16 hi and lo parts with rows padded by 8 halves, then
// Z_i, the denominators and a reduction scratch in f32. sla/linear_output.cuh's OutputLayout uses these functions.
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_output_operand_halves(int head_dim) {
  const int columns = head_dim < 64 ? head_dim : 64;
  const int state = head_dim * (columns + 8), weight = columns * (head_dim + 8);
  return state > weight ? state : weight;
}
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_output_rows(int block_q) {
  return (block_q + 15) / 16 * 16;
}
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_output_shared_bytes(int head_dim, int block_q) {
  const int rows = sage_sla_output_rows(block_q);
  return 2 * (2 * sage_sla_output_operand_halves(head_dim) + 2 * rows * (head_dim + 8)) + 4 * (head_dim + rows + 8);
}

// The mask GEMMs' CTA tile (sla/mask_gemm.cuh's MaskGemmTile): output rows, state columns, summed blocks per k-step,
// and the summed blocks whose factors fit its table. Their dynamic shared memory: A's tile (rows padded by 8 halves)
// and S's (likewise), each twice, the f16 factor table, then the rows' flags and a reduction scratch (8 floats).
// sm_90a runs the wgmma kernel (sla/mask_gemm_sm90.cuh) instead: 256 state columns per CTA, A's tile twice and S's
// SAGE_SLA_MASK_GEMM_WGMMA_STAGES times in wgmma's swizzled layouts (1024-byte aligned), the factor table, the flags,
// the scratch, and 1024 bytes to align the dynamic buffer. `sm`: 80, 86, 89, 90, ... as the module's target.
#define SAGE_SLA_MASK_GEMM_ROWS 128
#define SAGE_SLA_MASK_GEMM_COLUMNS 128
#define SAGE_SLA_MASK_GEMM_DEPTH 64
#define SAGE_SLA_MASK_GEMM_TABLE 4096
#define SAGE_SLA_MASK_GEMM_WGMMA_COLUMNS 256
#define SAGE_SLA_MASK_GEMM_WGMMA_STAGES 5
#define SAGE_SLA_MASK_GEMM_WGMMA_TILES 4 /* column tiles per CTA, walked in turn */
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_mask_gemm_wgmma(int sm) { return sm == 90; }
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_mask_gemm_columns(int sm) {
  return sage_sla_mask_gemm_wgmma(sm) ? SAGE_SLA_MASK_GEMM_WGMMA_COLUMNS : SAGE_SLA_MASK_GEMM_COLUMNS;
}
// The grid's CTAs along the d * d columns: one per column tile, or with wgmma one per SAGE_SLA_MASK_GEMM_WGMMA_TILES.
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_mask_gemm_column_ctas(int sm, int head_dim) {
  const int tiles = head_dim * head_dim / sage_sla_mask_gemm_columns(sm);
  return sage_sla_mask_gemm_wgmma(sm) ? (tiles + SAGE_SLA_MASK_GEMM_WGMMA_TILES - 1) / SAGE_SLA_MASK_GEMM_WGMMA_TILES
                                      : tiles;
}
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_mask_gemm_shared_bytes(int sm) {
  return sage_sla_mask_gemm_wgmma(sm)
             ? 2 * (2 * SAGE_SLA_MASK_GEMM_ROWS * SAGE_SLA_MASK_GEMM_DEPTH +
                    SAGE_SLA_MASK_GEMM_WGMMA_STAGES * SAGE_SLA_MASK_GEMM_DEPTH * SAGE_SLA_MASK_GEMM_WGMMA_COLUMNS +
                    SAGE_SLA_MASK_GEMM_TABLE) +
                   4 * (SAGE_SLA_MASK_GEMM_ROWS + 8) + 1024
             : 2 * (2 * SAGE_SLA_MASK_GEMM_ROWS * (SAGE_SLA_MASK_GEMM_DEPTH + 8) +
                    2 * SAGE_SLA_MASK_GEMM_DEPTH * (SAGE_SLA_MASK_GEMM_COLUMNS + 8) + SAGE_SLA_MASK_GEMM_TABLE) +
                   4 * (SAGE_SLA_MASK_GEMM_ROWS + 8);
}

// The statistics kernel's dynamic shared memory: Q and dO^s (block_q rows), K and V (block_kv rows) in f16 with rows
// padded by 8 halves, then L and D^s of a q block (f32).
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int
sage_sla_sparse_backward_shared_bytes(int head_dim, int block_q, int block_kv) {
  return 2 * (2 * block_q + 2 * block_kv) * (head_dim + 8) + 8 * block_q;
}

// The backward's rows and kv kernels on tensor cores (sla/backward.cuh): rows of a block staged SAGE_SLA_BACKWARD_CHUNK
// at a time. Rows: H_i (f16, rows padded by 8 halves), phi(Q) and W = dO^l / den of a chunk split in f16 hi and lo,
// then Z_i, dZ_i, 1 / den (block_q floats), two row-reduction buffers (4 x chunk) and a reduction scratch in f32. Kv:
// dh_j split in hi and lo, phi(K) of a chunk split, V of a chunk, then dz_j, one row-reduction buffer and the scratch.
#define SAGE_SLA_BACKWARD_CHUNK 32
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_rows_backward_shared_bytes(int head_dim,
                                                                                              int block_q) {
  return 2 * (head_dim + 8) * (head_dim + 4 * SAGE_SLA_BACKWARD_CHUNK) +
         4 * (2 * head_dim + block_q + 8 * SAGE_SLA_BACKWARD_CHUNK + 8);
}
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_kv_backward_shared_bytes(int head_dim) {
  return 2 * (head_dim + 8) * (2 * head_dim + 3 * SAGE_SLA_BACKWARD_CHUNK) +
         4 * (head_dim + 4 * SAGE_SLA_BACKWARD_CHUNK + 8);
}

// The fused sparse backward (launch 4c) double-buffers the q block's tiles where shared memory allows (sm_80, sm_90,
// sm_100: 163 KiB and more per block); sm_86, sm_89 and sm_120 (99 KiB) run one stage. `sm`: 80, 86, 89, 90, ...
// as the module's target (__CUDA_ARCH__ / 10).
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_sparse_fused_stages(int sm) {
  return sm == 80 || sm == 90 || sm == 100 ? 2 : 1;
}
// Its dynamic shared memory: K and V (block_kv rows) and dS^T (block_kv x block_q) in f16 with rows padded by 8 halves,
// then per stage Q and dO^s (block_q rows, f16, padded), then per stage L and D^s of the q block (f32).
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_sparse_fused_shared_bytes(int head_dim, int block_q,
                                                                                             int block_kv, int stages) {
  return 2 * (2 * block_kv * (head_dim + 8) + block_kv * (block_q + 8) + stages * 2 * block_q * (head_dim + 8)) +
         stages * 8 * block_q;
}

// 4c's work units: a kv block's critical (q head, q block) pairs in ceil(pairs / unit_items) units of equal size
// (within one), one CTA each, so that a kv block that is critical for most q blocks (attention sinks; the benchmark's
// inputs) does not leave the other SMs idle at the end. The grid, sage_sla_sparse_unit_capacity, bounds their number
// given every q block's critical_per_row pairs: at most one unit per kv block more than pairs / unit_items.
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE long long
sage_sla_sparse_unit_capacity(long long kv_columns, long long pairs, int unit_items) {
  return kv_columns + (pairs + unit_items - 1) / unit_items;
}

// sm_90a runs the fused kernel on warpgroup MMAs (sla/sparse_backward_sm90.cuh) where its tiles fit: blocks of 64
// (one warpgroup owns the kv block's 64 keys) and d = 64 or 128 (rows of whole 128-byte swizzle chunks), in an f16
// module (`bf16` 0); elsewhere, for other shapes and in a bf16 module, the mma.sync kernel above. Its dynamic shared
// memory: K, V [block_kv][d] and dS^T [block_kv][block_q] in f16, two stages of Q and dO^s [block_q][d] f16 (a stage
// then holds dQ's f32 tile), then per stage L and D^s (f32), every tile in wgmma's 128-byte-swizzled layout (1024-byte
// aligned), and 1024 bytes to align the dynamic buffer.
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int sage_sla_sparse_fused_wgmma(int sm, int head_dim, int block_q,
                                                                                      int block_kv, int bf16) {
  return !bf16 && sm == 90 && block_q == 64 && block_kv == 64 && (head_dim == 64 || head_dim == 128);
}
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int
sage_sla_sparse_fused_shared_bytes_sm90(int head_dim, int block_q, int block_kv) {
  return 2 * (2 * block_kv * head_dim + block_kv * block_q + 2 * 2 * block_q * head_dim) + 2 * 8 * block_q + 1024;
}
// The fused kernel's dynamic shared memory in a module built for `sm` and `bf16` (the kernel that module runs).
static inline SAGE_SLA_CONSTEXPR SAGE_SLA_HOST_DEVICE int
sage_sla_sparse_fused_module_shared_bytes(int sm, int head_dim, int block_q, int block_kv, int bf16) {
  return sage_sla_sparse_fused_wgmma(sm, head_dim, block_q, block_kv, bf16)
             ? sage_sla_sparse_fused_shared_bytes_sm90(head_dim, block_q, block_kv)
             : sage_sla_sparse_fused_shared_bytes(head_dim, block_q, block_kv, sage_sla_sparse_fused_stages(sm));
}

#endif // SAGE_SLA_ABI_CUH
