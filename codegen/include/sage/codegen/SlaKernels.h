// SLA's kernels (issue 13): one CUDA translation unit per (head dim, blocks, feature map, f16 / bf16) holding the six
// extern "C" kernels of an SLA forward besides its sparse part, and the four of its backward (which is the block_sparse
// attention kernel of the variant's sparseness, run with the predicted critical mask). Device code:
// codegen/device/sage/device/sla/; parameter blocks: sage/device/sla/abi.cuh (plain C, included by host and device).
//
// Launch order: pool -> predict (the mask prediction's two launches), states [-> totals when the marginal blocks are
// the majority] -> mask GEMM (H_i of every q block), the block-sparse attention with keep = critical, then output
// (O^l and O = O^s + Proj(O^l)).
#pragma once

#include "sage/device/sla/abi.cuh"
#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/InputType.h"

#include <array>
#include <string>
#include <string_view>

namespace sage::codegen {

inline constexpr std::string_view kSlaPoolKernel = "sage_sla_pool";       // grid (q_blocks + kv_blocks, h_q, b)
inline constexpr std::string_view kSlaPredictKernel = "sage_sla_predict"; // grid (ceil(q_blocks / rows), h_q, b)
inline constexpr std::string_view kSlaStatesKernel = "sage_sla_states";   // grid (kv_blocks, h_kv, b)
inline constexpr std::string_view kSlaTotalsKernel = "sage_sla_totals";   // grid (1, h_kv, b)
// H_i for every q block: grid (ceil(q_blocks / 128), slaMaskGemmColumnCtas, b * h_q); slaMaskGemmSharedBytes of
// dynamic shared memory (as the backward's mask GEMM; both depend on the module's arch: wgmma on sm_90a).
inline constexpr std::string_view kSlaMaskGemmKernel = "sage_sla_mask_gemm";
inline constexpr std::string_view kSlaOutputKernel = "sage_sla_output"; // grid (q_blocks, h_q, b)
// The backward (Algorithm 2): column tables, then the rows (dQ, dH_i, dZ_i), sum_i dZ_i, the mask GEMM (dh_j), then
// the kv blocks (dK, dV). The rows and kv kernels take slaRowsBackwardSharedBytes and slaKvBackwardSharedBytes of
// dynamic shared memory.
inline constexpr std::string_view kSlaColumnsKernel = "sage_sla_bwd_columns";      // grid (kv_blocks, h_q, b)
inline constexpr std::string_view kSlaRowsBackwardKernel = "sage_sla_bwd_rows";    // grid (q_blocks, h_q, b)
inline constexpr std::string_view kSlaRowTotalsKernel = "sage_sla_bwd_row_totals"; // grid (1, h_q, b)
// dh_j for every kv block: grid (ceil(kv_blocks / 128), d * d / 128, b * h_kv).
inline constexpr std::string_view kSlaColumnsMaskGemmKernel = "sage_sla_bwd_mask_gemm";
inline constexpr std::string_view kSlaKvBackwardKernel = "sage_sla_bwd_kv"; // grid (kv_blocks, h_kv, b)
// The sparse part's backward on tensor cores (abi.cuh's SageSlaSparseBackwardParams): the statistics (L, D^s, dO^s
// in f16; 2 * block_q threads, slaSparseBackwardSharedBytes), then the fused kv-major pass (dQ, dK, dV added;
// 2 * block_kv threads, slaSparseFusedSharedBytes), after the rows and kv kernels.
inline constexpr std::string_view kSlaSparseStatisticsKernel = "sage_sla_bwd_sparse_stats"; // grid (q_blocks, h_q, b)
inline constexpr std::string_view kSlaSparseFusedBackwardKernel = "sage_sla_bwd_sparse_fused"; // (kv_blocks, h_kv, b)
inline constexpr int kSlaThreads = 256;                                                        // every kernel's CTA
inline constexpr int kSlaMaxKvBlocks = 4096;                           // a row of P_c in shared memory
inline constexpr int kSlaMaxHeadDim = 128;                             // the output kernel's shared memory
inline constexpr int kSlaMaskGemmRows = SAGE_SLA_MASK_GEMM_ROWS;       // output rows per CTA of the mask GEMMs
inline constexpr int kSlaMaskGemmColumns = SAGE_SLA_MASK_GEMM_COLUMNS; // state columns per CTA (mma.sync)

// Instead of the statistics kernel where the forward saved L (SageSlaSparseDeltaParams): D^s and dO^s in f16 from the
// forward's O^s; 256 threads. Each of the two returns at once where the workspace's flag says the other runs.
inline constexpr std::string_view kSlaSparseDeltaKernel = "sage_sla_bwd_sparse_delta"; // grid (q_blocks, h_q, b)

struct SlaKernelSource {
  std::string name;   // sage_sla_d128_bq64_bkv64_softmax
  std::string source; // #includes the device library's sla headers
  std::array<std::string_view, 14> entry_points{kSlaPoolKernel,
                                                kSlaPredictKernel,
                                                kSlaStatesKernel,
                                                kSlaTotalsKernel,
                                                kSlaMaskGemmKernel,
                                                kSlaOutputKernel,
                                                kSlaColumnsKernel,
                                                kSlaRowsBackwardKernel,
                                                kSlaRowTotalsKernel,
                                                kSlaColumnsMaskGemmKernel,
                                                kSlaKvBackwardKernel,
                                                kSlaSparseStatisticsKernel,
                                                kSlaSparseFusedBackwardKernel,
                                                kSlaSparseDeltaKernel};
};

// Throws std::invalid_argument naming the field when the variant is not SLA, its head dim is not 16..128 (a power
// of two: the kernels split d x d states over 256 threads) or a block is larger than 128 (the sparse backward runs one
// warp per 16 rows of a block). `input`: the element type of Q, K, V, O^s and O (a bf16 module's name ends in _bf16).
SlaKernelSource generateSlaKernels(const AttentionVariant &variant,
                                   schedules::InputType input = schedules::InputType::f16);

// Dynamic shared memory of the output kernel (abi.cuh's formula, shared with the device code): split f16 operands of
// its two products; 72,480 bytes at d = 128, b_q = 64 (above the 48 KB default: the runner raises the limit).
inline int slaOutputSharedBytes(int head_dim, int block_q) { return sage_sla_output_shared_bytes(head_dim, block_q); }

// The mask GEMMs of a module built for `compute_capability` (abi.cuh): the grid's CTAs along the d * d state columns
// (one per 128-column tile with mma.sync; with wgmma on sm_90a one per four 256-column tiles, walked in turn) and
// their dynamic shared memory (80,416 and 206,328 bytes).
inline int slaMaskGemmColumnCtas(int compute_capability, int head_dim) {
  return sage_sla_mask_gemm_column_ctas(compute_capability, head_dim);
}
inline int slaMaskGemmSharedBytes(int compute_capability) {
  return sage_sla_mask_gemm_shared_bytes(compute_capability);
}

// Dynamic shared memory of the sparse backward's kernels (abi.cuh's formula): 70,144 bytes at d = 128, blocks 64.
inline int slaSparseBackwardSharedBytes(int head_dim, int block_q, int block_kv) {
  return sage_sla_sparse_backward_shared_bytes(head_dim, block_q, block_kv);
}

// Dynamic shared memory of the backward's rows and kv kernels on tensor cores (abi.cuh's formulas): 71,968 and 96,800
// bytes at d = 128, b_q = 64 (above the 48 KB default: the runner raises the limit).
inline int slaRowsBackwardSharedBytes(int head_dim, int block_q) {
  return sage_sla_rows_backward_shared_bytes(head_dim, block_q);
}
inline int slaKvBackwardSharedBytes(int head_dim) { return sage_sla_kv_backward_shared_bytes(head_dim); }
// Dynamic shared memory of the fused sparse backward for a module built for `arch` (abi.cuh's formulas: the kernel the
// arch runs, with its stages): 114,688 bytes at d = 128, blocks 64 with two stages (sm_80, sm_100f), 79,360 with one;
// 108,544 for sm_90a's wgmma kernel (an f16 module's; a bf16 module runs the mma.sync kernel there).
inline int slaSparseFusedSharedBytes(int head_dim, int block_q, int block_kv, int compute_capability,
                                     bool bf16 = false) {
  return sage_sla_sparse_fused_module_shared_bytes(compute_capability, head_dim, block_q, block_kv, bf16 ? 1 : 0);
}

// Whether the output kernel subtracts the non-marginal blocks from the totals (fewer reads): marginal > half a row.
bool slaMarginalMajority(const SlaSpec &spec, long long kv_blocks);

} // namespace sage::codegen
