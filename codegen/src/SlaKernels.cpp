// The translation unit of SLA's kernels: the Config constants and fifteen extern "C" entry points around the device
// library's templates (sage/device/sla/*.cuh).
#include "sage/codegen/SlaKernels.h"
#include "sage/codegen/SourceText.h"

#include <fmt/format.h>

#include <stdexcept>

namespace sage::codegen {

bool slaMarginalMajority(const SlaSpec &spec, long long kv_blocks) {
  const long long marginal =
      kv_blocks - criticalBlocksPerRow(spec, kv_blocks) - negligibleBlocksPerRow(spec, kv_blocks);
  return 2 * marginal > kv_blocks;
}

SlaKernelSource generateSlaKernels(const AttentionVariant &variant, schedules::InputType input) {
  if (!variant.sla.enabled)
    throw std::invalid_argument("variant: '" + variant.name + "' is not an SLA variant");
  const int d = variant.head_dim;
  if (d < 16 || d > kSlaMaxHeadDim || (d & (d - 1)) != 0)
    throw std::invalid_argument("head_dim: the SLA kernels take 16, 32, 64 or 128, got " + std::to_string(d));
  if (variant.block_q > 128 || variant.block_kv > 128)
    throw std::invalid_argument("blocks: the SLA backward takes blocks of at most 128 tokens, got block_q=" +
                                std::to_string(variant.block_q) + ", block_kv=" + std::to_string(variant.block_kv));
  SlaKernelSource kernel;
  const std::string_view phi = nameOf(variant.sla.feature_map);
  const bool bf16 = input == schedules::InputType::bf16;
  // An f16 module keeps the name (and the source) it had before bf16 modules existed.
  kernel.name =
      fmt::format("sage_sla_d{}_bq{}_bkv{}_{}{}", d, variant.block_q, variant.block_kv, phi, bf16 ? "_bf16" : "");
  kernel.source = fmt::format(
      R"(// SLA (sparse-linear attention): mask prediction and the linear branch of '{name}'.
#include "sage/device/sla/backward.cuh"
#include "sage/device/sla/linear_output.cuh"
#include "sage/device/sla/linear_states.cuh"
#include "sage/device/sla/mask_gemm.cuh"
#include "sage/device/sla/mask_prediction.cuh"
#include "sage/device/sla/sparse_backward.cuh"

namespace {{
constexpr int kHeadDim = {d};
constexpr int kBlockQ = {block_q};
constexpr int kBlockKv = {block_kv};
constexpr int kPhi = {phi_number}; // {phi}
constexpr bool kBf16 = {bf16}; // Q, K, V, O^s and O in bf16 (else f16)
}} // namespace

// Algorithm 1, line 5: pool(Q), pool(K)
extern "C" __global__ void __launch_bounds__(256) {pool}(const SageSlaPoolParams p) {{
  sage::device::sla::pool_blocks<kHeadDim, kBlockQ, kBlockKv, kBf16>(p);
}}

// Lines 5-6: P_c, M_c (top {critical}% critical, bottom {negligible}% negligible) and the lookup tables. Two CTAs
// per SM: with (256) alone NVRTC's ptxas holds it to 64 registers and spills.
extern "C" __global__ void __launch_bounds__(256, 2) {predict}(const SageSlaPredictParams p) {{
  sage::device::sla::predict_rows<kHeadDim>(p);
}}

// Line 4: h_j = phi(K_j)^T V_j (tensor cores; f16 h_j / s_j), z_j = rowsum(phi(K_j)^T)
extern "C" __global__ void __launch_bounds__(256, 2) {states}(const SageSlaStateParams p) {{
  sage::device::sla::linear_states<kHeadDim, kBlockKv, kPhi, kBf16>(p);
}}

// Pre-aggregation of Z_i: sum_j z_j
extern "C" __global__ void __launch_bounds__(256) {totals}(const SageSlaTotalsParams p) {{
  sage::device::sla::linear_totals<kHeadDim>(p);
}}

// Line 13 for every q block at once: H = (M_c == marginal) [h_j] on tensor cores
extern "C" __global__ void __launch_bounds__(256, sage::device::sla::kMaskGemmMinBlocks) {mask_gemm}(const SageSlaMaskGemmParams p) {{
  sage::device::sla::forward_mask_gemm<kHeadDim>(p);
}}

// Lines 13 and 16: H_i, Z_i, O^l_i = phi(Q_i) H_i / (phi(Q_i) Z_i); O = O^s + Proj(O^l)
extern "C" __global__ void __launch_bounds__(256, sage::device::sla::output_min_blocks(kHeadDim, kBlockQ)) {output}(const SageSlaOutputParams p) {{
  sage::device::sla::linear_output<kHeadDim, kBlockQ, kPhi, kBf16>(p);
}}

// Backward (Algorithm 2): the column lookup tables of M_c
extern "C" __global__ void __launch_bounds__(256) {columns}(const SageSlaColumnsParams p) {{
  sage::device::sla::column_tables(p);
}}

// Lines 4-6 per q block, linear branch: dQ, dH_i, dZ_i
extern "C" __global__ void __launch_bounds__(256, sage::device::sla::kRowsBackwardMinBlocks) {rows}(const SageSlaRowsBackwardParams p) {{
  sage::device::sla::rows_backward<kHeadDim, kBlockQ, kBlockKv, kPhi, kBf16>(p);
}}

// Pre-aggregation of the backward's dz_j: sum_i dZ_i
extern "C" __global__ void __launch_bounds__(256) {row_totals}(const SageSlaRowTotalsParams p) {{
  sage::device::sla::row_totals<kHeadDim>(p);
}}

// dh_j = (M_c == marginal)^T [dH_i] over the GQA group, for every kv block at once, on tensor cores
extern "C" __global__ void __launch_bounds__(256, sage::device::sla::kMaskGemmMinBlocks) {columns_gemm}(const SageSlaMaskGemmColumnsParams p) {{
  sage::device::sla::backward_mask_gemm<kHeadDim>(p);
}}

// Lines 7-17 per kv block, linear branch: dK, dV
extern "C" __global__ void __launch_bounds__(256, sage::device::sla::kKvBackwardMinBlocks) {kv}(const SageSlaColumnsBackwardParams p) {{
  sage::device::sla::columns_backward<kHeadDim, kBlockQ, kBlockKv, kPhi, kBf16>(p);
}}

// Lines 2-3 per q block, sparse part: L, D^s (and dO^s in f16) for the fused kernel
extern "C" __global__ void __launch_bounds__(2 * kBlockQ, sage::device::sla::kSparseRowsMinBlocks) {sparse_stats}(const SageSlaSparseBackwardParams p) {{
  sage::device::sla::sparse_row_statistics<kHeadDim, kBlockQ, kBlockKv, kBf16>(p);
}}

// Lines 7-12 per kv block, sparse part, P recomputed once per critical pair: dK +=, dV +=, dQ += (f32 reductions)
extern "C" __global__ void __launch_bounds__(2 * kBlockKv) {sparse_fused}(const SageSlaSparseBackwardParams p) {{
  sage::device::sla::sparse_fused_backward<kHeadDim, kBlockQ, kBlockKv, kBf16>(p);
}}

// Lines 2-3 where the forward saved L (instead of sparse_stats): D^s = rowsum(dO^s o O^s), dO^s in f16
extern "C" __global__ void __launch_bounds__(256) {sparse_delta}(const SageSlaSparseDeltaParams p) {{
  sage::device::sla::sparse_row_delta<kHeadDim, kBlockQ, kBf16>(p);
}}
)",
      fmt::arg("columns", kSlaColumnsKernel), fmt::arg("rows", kSlaRowsBackwardKernel),
      fmt::arg("row_totals", kSlaRowTotalsKernel), fmt::arg("columns_gemm", kSlaColumnsMaskGemmKernel),
      fmt::arg("kv", kSlaKvBackwardKernel), fmt::arg("sparse_stats", kSlaSparseStatisticsKernel),
      fmt::arg("sparse_fused", kSlaSparseFusedBackwardKernel), fmt::arg("name", sourceSafe(variant.name)),
      fmt::arg("d", d), fmt::arg("block_q", variant.block_q), fmt::arg("block_kv", variant.block_kv),
      fmt::arg("phi_number", static_cast<int>(variant.sla.feature_map)), fmt::arg("phi", phi),
      fmt::arg("pool", kSlaPoolKernel), fmt::arg("predict", kSlaPredictKernel), fmt::arg("states", kSlaStatesKernel),
      fmt::arg("totals", kSlaTotalsKernel), fmt::arg("mask_gemm", kSlaMaskGemmKernel),
      fmt::arg("output", kSlaOutputKernel), fmt::arg("critical", variant.sla.critical_percent),
      fmt::arg("negligible", variant.sla.negligible_percent), fmt::arg("sparse_delta", kSlaSparseDeltaKernel),
      fmt::arg("bf16", bf16));
  return kernel;
}

} // namespace sage::codegen
