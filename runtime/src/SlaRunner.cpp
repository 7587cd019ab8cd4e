// SLA's forward: the SLA kernels (codegen's SlaKernels.h) compiled with NVRTC through the kernel cache and
// launched around the block-sparse attention of the variant's sparse part.
#include "sage/runtime/SlaRunner.h"

#include "sage/codegen/SlaKernels.h"
#include "sage/runtime/ArgumentError.h"
#include "sage/runtime/AuxiliaryKernels.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GeneratedKernelLoader.h"
#include "sage/runtime/LoadedKernel.h"
#include "sage/runtime/ProcessResources.h"

#include <fmt/core.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace sage::runtime {
namespace {

constexpr size_t kAlignment = 256;

size_t alignUp(size_t value) { return (value + kAlignment - 1) / kAlignment * kAlignment; }

// Critical pairs per work unit of the fused sparse backward (abi.cuh's sage_sla_sparse_unit_capacity): small enough
// that a kv block critical for every q block splits into units that fill the SMs, large enough that a unit's K and V
// copies and its dK and dV reductions are a small part of its work. SAGEGEN_SLA_SPARSE_UNIT_ITEMS overrides it (tests
// and tuning: a small value splits every kv block); a value that is not a whole number in [1, 65536] is refused.
int sparseUnitItems() {
  constexpr int kDefault = 64, kMost = 65536;
  const char *value = std::getenv("SAGEGEN_SLA_SPARSE_UNIT_ITEMS");
  if (!value || !*value)
    return kDefault;
  int items = 0;
  const char *end = value + std::strlen(value);
  const auto [rest, error] = std::from_chars(value, end, items);
  if (error != std::errc() || rest != end || items < 1 || items > kMost)
    throw ArgumentError("SAGEGEN_SLA_SPARSE_UNIT_ITEMS",
                        fmt::format("expected a whole number of critical pairs in [1, {}], got '{}'", kMost, value));
  return items;
}

driver::Dim3 grid(long long x, long long y, long long z) {
  return {static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
}

} // namespace

void checkSlaSparseOutputStrides(const SageTensorStrides &strides, const schedules::ProblemShape &shape) {
  if (strides.batch <= 0 || strides.head <= 0 || strides.token < shape.head_dim)
    throw std::invalid_argument(
        "tensors.o_sparse_strides: expected positive batch and head strides and a token stride of at least head_dim (" +
        std::to_string(shape.head_dim) + "), in elements; got (" + std::to_string(strides.batch) + ", " +
        std::to_string(strides.head) + ", " + std::to_string(strides.token) + ")");
}

struct SlaRunner::State {
  AttentionVariant variant;
  schedules::InputType input = schedules::InputType::f16; // of Q, K, V, O^s and O (the module's and the sparse part's)
  std::unique_ptr<AttentionRunner> sparse;
  driver::Context context = nullptr;
  std::string module_name;
  CacheSource module_source = CacheSource::built;
  double compile_milliseconds = 0.0;
  LoadedKernel pool, predict, states, totals, mask_gemm, output, columns, rows_backward, row_totals, columns_gemm,
      kv_backward;
  LoadedKernel sparse_stats, sparse_fused; // the sparse part's backward
  unsigned sparse_fused_shared = 0;        // for the module arch's kernel (wgmma on sm_90a)
  LoadedKernel sparse_delta;               // D^s and dO^s from a saved L and O^s, instead of sparse_stats
  bool saves_lse = false;                  // the sparse part writes its L (slaSparsePartIsExact)
  unsigned mask_gemm_column_ctas = 0;      // the mask GEMMs' grid along the state columns (the module's arch)
  unsigned mask_gemm_shared = 0;           // and their dynamic shared memory
};

SlaRunner::SlaRunner(const AttentionVariant &variant, AttentionRunnerOptions options)
    : state_(std::make_unique<State>()) {
  if (!variant.sla.enabled)
    throw std::invalid_argument("variant: '" + variant.name + "' is not an SLA variant");
  state_->variant = variant;
  state_->input = options.input;
  codegen::generateSlaKernels(variant, options.input); // checks the head dim before the sparse part is compiled
  state_->saves_lse = slaSparsePartIsExact(variant);
  state_->sparse = std::make_unique<AttentionRunner>(slaSparsePart(variant), options);

  const CudaDriver &driver = CudaDriver::instance();
  state_->context = driver.primaryContext(state_->sparse->device());
  ScopedContext scope(driver, state_->context);
  const schedules::GpuArch arch = options.arch.value_or(currentDeviceArch());
  const GeneratedKernel module_kernel = generateSlaModule(variant, arch, {}, options.input);
  state_->module_name = module_kernel.name;
  const std::shared_ptr<const AotKernelDirectory> aot = aotDirectoryFor(options.aot_directory);
  const LoadedGeneratedKernel loaded =
      loadGeneratedKernel(module_kernel, options.cache ? *options.cache : processKernelCache(), aot.get());
  state_->module_source = loaded.source;
  state_->compile_milliseconds = loaded.compile_milliseconds;
  const std::shared_ptr<const LoadedModule> &module = loaded.module;
  state_->pool = module->kernel(std::string(codegen::kSlaPoolKernel));
  state_->predict = module->kernel(std::string(codegen::kSlaPredictKernel));
  state_->states = module->kernel(std::string(codegen::kSlaStatesKernel));
  state_->totals = module->kernel(std::string(codegen::kSlaTotalsKernel));
  state_->mask_gemm = module->kernel(std::string(codegen::kSlaMaskGemmKernel));
  state_->output = module->kernel(std::string(codegen::kSlaOutputKernel));
  state_->columns = module->kernel(std::string(codegen::kSlaColumnsKernel));
  state_->rows_backward = module->kernel(std::string(codegen::kSlaRowsBackwardKernel));
  state_->row_totals = module->kernel(std::string(codegen::kSlaRowTotalsKernel));
  state_->columns_gemm = module->kernel(std::string(codegen::kSlaColumnsMaskGemmKernel));
  state_->kv_backward = module->kernel(std::string(codegen::kSlaKvBackwardKernel));
  state_->mask_gemm_column_ctas =
      static_cast<unsigned>(codegen::slaMaskGemmColumnCtas(schedules::computeCapability(arch), variant.head_dim));
  state_->mask_gemm_shared = static_cast<unsigned>(codegen::slaMaskGemmSharedBytes(schedules::computeCapability(arch)));
  state_->mask_gemm.setMaxDynamicSharedMemory(static_cast<int>(state_->mask_gemm_shared));
  state_->columns_gemm.setMaxDynamicSharedMemory(static_cast<int>(state_->mask_gemm_shared));
  state_->output.setMaxDynamicSharedMemory(codegen::slaOutputSharedBytes(variant.head_dim, variant.block_q));
  const int sparse_shared = codegen::slaSparseBackwardSharedBytes(variant.head_dim, variant.block_q, variant.block_kv);
  state_->sparse_stats = module->kernel(std::string(codegen::kSlaSparseStatisticsKernel));
  state_->sparse_fused = module->kernel(std::string(codegen::kSlaSparseFusedBackwardKernel));
  state_->sparse_stats.setMaxDynamicSharedMemory(sparse_shared);
  state_->sparse_fused_shared = static_cast<unsigned>(codegen::slaSparseFusedSharedBytes(
      variant.head_dim, variant.block_q, variant.block_kv, schedules::computeCapability(arch),
      options.input == schedules::InputType::bf16));
  state_->sparse_fused.setMaxDynamicSharedMemory(static_cast<int>(state_->sparse_fused_shared));
  state_->rows_backward.setMaxDynamicSharedMemory(
      codegen::slaRowsBackwardSharedBytes(variant.head_dim, variant.block_q));
  state_->kv_backward.setMaxDynamicSharedMemory(codegen::slaKvBackwardSharedBytes(variant.head_dim));
  state_->sparse_delta = module->kernel(std::string(codegen::kSlaSparseDeltaKernel));
}

SlaRunner::~SlaRunner() = default;

const AttentionRunner &SlaRunner::sparsePart() const { return *state_->sparse; }

std::string SlaRunner::describe() const {
  const State &state = *state_;
  return fmt::format("SLA '{}': {} [{}{}]; sparse part: {}", state.variant.name, state.module_name,
                     cacheSourceName(state.module_source),
                     state.module_source == CacheSource::built ? fmt::format(" {:.0f} ms", state.compile_milliseconds)
                                                               : std::string(),
                     state.sparse->describe());
}

CacheSource SlaRunner::moduleSource() const { return state_->module_source; }
const AttentionVariant &SlaRunner::variant() const { return state_->variant; }
schedules::InputType SlaRunner::input() const { return state_->input; }

SlaWorkspaceLayout SlaRunner::workspaceLayout(const schedules::ProblemShape &shape, bool backward) const {
  const AttentionVariant &variant = state_->variant;
  if (shape.batch <= 0 || shape.heads_q <= 0 || shape.heads_kv <= 0 || shape.tokens_q <= 0 || shape.tokens_kv <= 0 ||
      shape.heads_q % shape.heads_kv != 0)
    throw std::invalid_argument("shape: expected positive sizes and heads_q a multiple of heads_kv");
  if (shape.head_dim != variant.head_dim)
    throw std::invalid_argument("shape.head_dim: the variant's is " + std::to_string(variant.head_dim) + ", got " +
                                std::to_string(shape.head_dim));
  const long long q_blocks = (shape.tokens_q + variant.block_q - 1) / variant.block_q;
  const long long kv_blocks = (shape.tokens_kv + variant.block_kv - 1) / variant.block_kv;
  if (kv_blocks > codegen::kSlaMaxKvBlocks)
    throw std::invalid_argument("shape.tokens_kv: the mask prediction holds at most " +
                                std::to_string(codegen::kSlaMaxKvBlocks) + " kv blocks per row, got " +
                                std::to_string(kv_blocks));
  if (shape.batch * shape.heads_q > 65535)
    throw std::invalid_argument("shape: the mask GEMM's grid holds at most 65535 (batch x heads_q), got " +
                                std::to_string(shape.batch * shape.heads_q));
  SlaWorkspaceLayout layout;
  const long long critical = criticalBlocksPerRow(variant.sla, kv_blocks);
  const long long negligible = negligibleBlocksPerRow(variant.sla, kv_blocks);
  layout.marginal_majority = codegen::slaMarginalMajority(variant.sla, kv_blocks);
  const long long marginal = kv_blocks - critical - negligible;
  const long long listed = layout.marginal_majority ? kv_blocks - marginal : marginal;
  layout.shape = {static_cast<int>(shape.batch),    static_cast<int>(shape.heads_q),   static_cast<int>(shape.heads_kv),
                  static_cast<int>(shape.tokens_q), static_cast<int>(shape.tokens_kv), static_cast<int>(q_blocks),
                  static_cast<int>(kv_blocks),      static_cast<int>(critical),        static_cast<int>(negligible)};
  const size_t d = static_cast<size_t>(variant.head_dim);
  const size_t rows = static_cast<size_t>(shape.batch * shape.heads_q * q_blocks);
  const size_t kv_heads = static_cast<size_t>(shape.batch * shape.heads_kv);
  size_t offset = 0;
  auto take = [&](size_t &field, size_t bytes) {
    field = offset;
    offset = alignUp(offset + bytes);
  };
  take(layout.pooled_q, rows * d * 4);
  take(layout.pooled_k, kv_heads * static_cast<size_t>(kv_blocks) * d * 4);
  take(layout.compressed, rows * static_cast<size_t>(kv_blocks) * 4);
  take(layout.classes, rows * static_cast<size_t>(kv_blocks));
  take(layout.critical_mask, rows * static_cast<size_t>(kv_blocks));
  take(layout.critical_lut, rows * static_cast<size_t>(critical) * 4);
  take(layout.linear_lut, rows * static_cast<size_t>(listed) * 4);
  take(layout.h_states, kv_heads * static_cast<size_t>(kv_blocks) * d * d * 2);
  take(layout.h_scales, kv_heads * static_cast<size_t>(kv_blocks) * 4);
  take(layout.z_states, kv_heads * static_cast<size_t>(kv_blocks) * d * 4);
  take(layout.z_total, kv_heads * d * 4);
  take(layout.h_sums, rows * d * d * 4);
  take(layout.h_sum_fallback, rows * 4);
  take(layout.lse_saved, 4);
  take(layout.attention, state_->sparse->workspaceBytes(shape));
  // The backward's regions after the forward's: a backward layout keeps every forward offset.
  if (backward) {
    const size_t tokens = static_cast<size_t>(shape.batch * shape.heads_q * shape.tokens_q);
    const size_t columns = static_cast<size_t>(shape.batch * shape.heads_q * kv_blocks);
    take(layout.lse, tokens * 4);
    take(layout.delta, tokens * 4);
    take(layout.dh_rows, rows * d * d * 2);
    take(layout.dh_scales, rows * 4);
    take(layout.dz_rows, rows * d * 4);
    take(layout.dh_sums, kv_heads * static_cast<size_t>(kv_blocks) * d * d * 4);
    take(layout.dh_sum_fallback, kv_heads * static_cast<size_t>(kv_blocks) * 4);
    take(layout.dz_total, static_cast<size_t>(shape.batch * shape.heads_q) * d * 4);
    take(layout.critical_columns, columns * static_cast<size_t>(q_blocks) * 4);
    take(layout.marginal_columns, columns * static_cast<size_t>(q_blocks) * 4);
    take(layout.non_marginal_columns, columns * static_cast<size_t>(q_blocks) * 4);
    take(layout.column_counts, columns * 3 * 4);
    take(layout.h_rows, rows * d * d * 2); // H_i, Z_i: run() writes them into a backward-sized workspace
    take(layout.h_row_scales, rows * 4);
    take(layout.z_rows, rows * d * 4);
    take(layout.d_sparse_f16, tokens * d * 2); // dO^s in f16: the sparse statistics kernel's copy for the fused one
    layout.sparse_unit_items = sparseUnitItems();
    layout.sparse_unit_capacity =
        sage_sla_sparse_unit_capacity(static_cast<long long>(kv_heads) * kv_blocks,
                                      static_cast<long long>(rows) * critical, layout.sparse_unit_items);
    take(layout.sparse_units, static_cast<size_t>(layout.sparse_unit_capacity) * 16);
    take(layout.sparse_unit_count, 4);
  }
  layout.total = offset;
  return layout;
}

void SlaRunner::run(const schedules::ProblemShape &shape, const SlaTensors &tensors, void *workspace,
                    size_t workspace_bytes, driver::Stream stream, RunPhase phase) const {
  const SlaWorkspaceLayout layout = workspaceLayout(shape);
  // A workspace laid out for the backward too: the output kernel keeps H_i and Z_i there for it.
  const SlaWorkspaceLayout backward_layout = workspaceLayout(shape, true);
  const bool keep_rows = workspace_bytes >= backward_layout.total;
  if (!workspace || workspace_bytes < layout.total)
    throw std::invalid_argument("workspace: " + std::to_string(layout.total) + " bytes needed, got " +
                                std::to_string(workspace_bytes));
  if (!tensors.q || !tensors.k || !tensors.v || !tensors.o)
    throw std::invalid_argument("tensors: q, k, v and o are required");
  auto *base = static_cast<unsigned char *>(workspace);
  auto at = [base](size_t offset) { return base + offset; };
  // L for the backward: where the sparse part is exact, the workspace has the backward's regions and O^s stays in `o`
  // (no Proj in place: the backward can be handed it). The flag tells the backward whether this forward wrote it (a
  // later forward with a smaller workspace, Proj in place or a quantized sparse part clears it).
  const bool save_lse = state_->saves_lse && keep_rows && phase == RunPhase::all && tensors.proj_weight == nullptr;
  const SageSlaShape &size = layout.shape;
  const SageSlaStrides q_strides{tensors.q_strides.batch, tensors.q_strides.head, tensors.q_strides.token};
  const SageSlaStrides k_strides{tensors.k_strides.batch, tensors.k_strides.head, tensors.k_strides.token};
  const SageSlaStrides v_strides{tensors.v_strides.batch, tensors.v_strides.head, tensors.v_strides.token};
  const SageSlaStrides o_strides{tensors.o_strides.batch, tensors.o_strides.head, tensors.o_strides.token};
  const driver::Dim3 block{codegen::kSlaThreads, 1, 1};
  const int d = state_->variant.head_dim;
  ScopedContext scope(CudaDriver::instance(), state_->context);

  // Mask prediction: pool(Q), pool(K); P_c, M_c and the lookup tables.
  const SageSlaPoolParams pool{tensors.q,
                               tensors.k,
                               q_strides,
                               k_strides,
                               size,
                               reinterpret_cast<float *>(at(layout.pooled_q)),
                               reinterpret_cast<float *>(at(layout.pooled_k)),
                               reinterpret_cast<int *>(at(layout.lse_saved)),
                               save_lse ? 1 : 0};
  state_->pool.launch(pool, {grid(size.q_blocks + size.kv_blocks, size.heads_q, size.batch), block, 0, stream});
  const SageSlaPredictParams predict{reinterpret_cast<const float *>(at(layout.pooled_q)),
                                     reinterpret_cast<const float *>(at(layout.pooled_k)),
                                     size,
                                     1.0f / std::sqrt(static_cast<float>(d)),
                                     reinterpret_cast<float *>(at(layout.compressed)),
                                     reinterpret_cast<signed char *>(at(layout.classes)),
                                     at(layout.critical_mask),
                                     reinterpret_cast<int *>(at(layout.critical_lut)),
                                     reinterpret_cast<int *>(at(layout.linear_lut)),
                                     layout.marginal_majority ? 1 : 0};
  const int predict_rows = sage_sla_predict_rows(size.kv_blocks);
  state_->predict.launch(
      predict, {grid((size.q_blocks + predict_rows - 1) / predict_rows, size.heads_q, size.batch), block, 0, stream});
  if (phase == RunPhase::prologue)
    return;

  // h_j, z_j (and sum_j z_j for pre-aggregation).
  const SageSlaStateParams states{tensors.k,
                                  tensors.v,
                                  k_strides,
                                  v_strides,
                                  size,
                                  reinterpret_cast<unsigned short *>(at(layout.h_states)),
                                  reinterpret_cast<float *>(at(layout.h_scales)),
                                  reinterpret_cast<float *>(at(layout.z_states))};
  state_->states.launch(states, {grid(size.kv_blocks, size.heads_kv, size.batch), block, 0, stream});
  if (layout.marginal_majority) {
    const SageSlaTotalsParams totals{reinterpret_cast<const float *>(at(layout.z_states)), size,
                                     reinterpret_cast<float *>(at(layout.z_total))};
    state_->totals.launch(totals, {grid(1, size.heads_kv, size.batch), block, 0, stream});
  }

  // H_i of every q block: the GEMM of the marginal mask and the states. It replaces the output kernel's sums over
  // the listed h_j (~77 states of 32 KB per q block at 95% sparsity, N = 32k, read from L2) with
  // 2 q_blocks kv_blocks d^2 tensor-core flops per head whatever the sparsity.
  const SageSlaMaskGemmParams mask_gemm{reinterpret_cast<const signed char *>(at(layout.classes)),
                                        reinterpret_cast<const unsigned short *>(at(layout.h_states)),
                                        reinterpret_cast<const float *>(at(layout.h_scales)),
                                        size,
                                        reinterpret_cast<float *>(at(layout.h_sums)),
                                        reinterpret_cast<int *>(at(layout.h_sum_fallback))};
  state_->mask_gemm.launch(mask_gemm,
                           {grid((size.q_blocks + codegen::kSlaMaskGemmRows - 1) / codegen::kSlaMaskGemmRows,
                                 state_->mask_gemm_column_ctas, static_cast<long long>(size.batch) * size.heads_q),
                            block, state_->mask_gemm_shared, stream});

  // O^s: the sparse part over the critical blocks.
  AttentionTensors attention;
  attention.q = tensors.q;
  attention.k = tensors.k;
  attention.v = tensors.v;
  attention.q_strides = tensors.q_strides;
  attention.k_strides = tensors.k_strides;
  attention.v_strides = tensors.v_strides;
  attention.o = tensors.o;
  attention.o_strides = tensors.o_strides;
  attention.block_mask = at(layout.critical_mask);
  attention.lse = save_lse ? reinterpret_cast<float *>(at(backward_layout.lse)) : nullptr;
  state_->sparse->run(shape, attention, at(layout.attention), layout.total - layout.attention, stream);

  // O^l and O = O^s + Proj(O^l), in place over O^s.
  const SageSlaOutputParams output{tensors.q,
                                   q_strides,
                                   reinterpret_cast<const unsigned short *>(at(layout.h_states)),
                                   reinterpret_cast<const float *>(at(layout.h_scales)),
                                   reinterpret_cast<const float *>(at(layout.z_states)),
                                   reinterpret_cast<const float *>(at(layout.z_total)),
                                   reinterpret_cast<const int *>(at(layout.linear_lut)),
                                   layout.marginal_majority ? 1 : 0,
                                   reinterpret_cast<float *>(at(layout.h_sums)),
                                   reinterpret_cast<const int *>(at(layout.h_sum_fallback)),
                                   tensors.o,
                                   o_strides,
                                   tensors.proj_weight,
                                   tensors.proj_bias,
                                   size,
                                   tensors.o_linear,
                                   tensors.o,
                                   o_strides,
                                   keep_rows ? reinterpret_cast<unsigned short *>(at(backward_layout.h_rows)) : nullptr,
                                   keep_rows ? reinterpret_cast<float *>(at(backward_layout.h_row_scales)) : nullptr,
                                   keep_rows ? reinterpret_cast<float *>(at(backward_layout.z_rows)) : nullptr};
  state_->output.launch(output,
                        {grid(size.q_blocks, size.heads_q, size.batch), block,
                         static_cast<unsigned>(codegen::slaOutputSharedBytes(d, state_->variant.block_q)), stream});
}

void SlaRunner::backward(const schedules::ProblemShape &shape, const SlaBackwardTensors &tensors, void *workspace,
                         size_t workspace_bytes, driver::Stream stream) const {
  const SlaWorkspaceLayout layout = workspaceLayout(shape, true);
  if (!workspace || workspace_bytes < layout.total)
    throw std::invalid_argument("workspace: the backward needs " + std::to_string(layout.total) + " bytes, got " +
                                std::to_string(workspace_bytes));
  if (!tensors.q || !tensors.k || !tensors.v || !tensors.d_sparse || !tensors.d_linear || !tensors.dq || !tensors.dk ||
      !tensors.dv)
    throw std::invalid_argument("tensors: q, k, v, d_sparse, d_linear, dq, dk and dv are required");
  if (tensors.o_sparse)
    checkSlaSparseOutputStrides(tensors.o_sparse_strides, shape);
  auto *base = static_cast<unsigned char *>(workspace);
  auto floats = [base](size_t offset) { return reinterpret_cast<float *>(base + offset); };
  auto ints = [base](size_t offset) { return reinterpret_cast<int *>(base + offset); };
  auto halves = [base](size_t offset) { return reinterpret_cast<unsigned short *>(base + offset); };
  const SageSlaShape &size = layout.shape;
  const SageSlaStrides q_strides{tensors.q_strides.batch, tensors.q_strides.head, tensors.q_strides.token};
  const SageSlaStrides k_strides{tensors.k_strides.batch, tensors.k_strides.head, tensors.k_strides.token};
  const SageSlaStrides v_strides{tensors.v_strides.batch, tensors.v_strides.head, tensors.v_strides.token};
  const driver::Dim3 block{codegen::kSlaThreads, 1, 1};
  const int d = state_->variant.head_dim;
  const auto rows_shared = static_cast<unsigned>(codegen::slaRowsBackwardSharedBytes(d, state_->variant.block_q));
  const auto kv_shared = static_cast<unsigned>(codegen::slaKvBackwardSharedBytes(d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ScopedContext scope(CudaDriver::instance(), state_->context);

  const SageSlaColumnsParams columns{reinterpret_cast<const signed char *>(base + layout.classes),
                                     size,
                                     ints(layout.critical_columns),
                                     ints(layout.marginal_columns),
                                     ints(layout.non_marginal_columns),
                                     ints(layout.column_counts),
                                     ints(layout.sparse_unit_count)};
  state_->columns.launch(columns, {grid(size.kv_blocks, size.heads_q, size.batch), block, 0, stream});
  const SageSlaRowsBackwardParams rows{tensors.q,
                                       tensors.k,
                                       tensors.v,
                                       q_strides,
                                       k_strides,
                                       v_strides,
                                       tensors.d_sparse,
                                       tensors.d_linear,
                                       ints(layout.critical_lut),
                                       halves(layout.h_rows),
                                       floats(layout.h_row_scales),
                                       floats(layout.z_rows),
                                       size,
                                       scale,
                                       floats(layout.lse),
                                       floats(layout.delta),
                                       tensors.dq,
                                       halves(layout.dh_rows),
                                       floats(layout.dh_scales),
                                       floats(layout.dz_rows)};
  state_->rows_backward.launch(rows, {grid(size.q_blocks, size.heads_q, size.batch), block, rows_shared, stream});
  // The sparse part: L, D^s and dO^s in f16 per q block here; dQ, dK, dV in one kv-major pass at the end. Where the
  // forward saved L (the workspace's flag, read on the device) and O^s is given, the delta kernel forms D^s from O^s
  // and the statistics kernel returns at once; else the delta kernel returns and the statistics kernel recomputes.
  const bool saved_lse = state_->saves_lse && tensors.o_sparse != nullptr;
  const int *lse_saved = saved_lse ? ints(layout.lse_saved) : nullptr;
  if (saved_lse) {
    const SageSlaStrides o_sparse_strides{tensors.o_sparse_strides.batch, tensors.o_sparse_strides.head,
                                          tensors.o_sparse_strides.token};
    const SageSlaSparseDeltaParams delta{
        tensors.d_sparse,     tensors.o_sparse,           o_sparse_strides, lse_saved, size,
        floats(layout.delta), halves(layout.d_sparse_f16)};
    state_->sparse_delta.launch(delta, {grid(size.q_blocks, size.heads_q, size.batch), block, 0, stream});
  }
  const SageSlaSparseBackwardParams sparse{tensors.q,
                                           tensors.k,
                                           tensors.v,
                                           q_strides,
                                           k_strides,
                                           v_strides,
                                           tensors.d_sparse,
                                           halves(layout.d_sparse_f16),
                                           ints(layout.critical_lut),
                                           ints(layout.critical_columns),
                                           ints(layout.column_counts),
                                           size,
                                           scale,
                                           floats(layout.lse),
                                           floats(layout.delta),
                                           tensors.dq,
                                           tensors.dk,
                                           tensors.dv,
                                           lse_saved,
                                           ints(layout.sparse_units),
                                           ints(layout.sparse_unit_count)};
  const auto sparse_shared = static_cast<unsigned>(
      codegen::slaSparseBackwardSharedBytes(d, state_->variant.block_q, state_->variant.block_kv));
  state_->sparse_stats.launch(sparse, {grid(size.q_blocks, size.heads_q, size.batch),
                                       {static_cast<unsigned>(2 * state_->variant.block_q), 1, 1},
                                       sparse_shared,
                                       stream});
  const SageSlaRowTotalsParams totals{floats(layout.dz_rows), size, floats(layout.dz_total)};
  state_->row_totals.launch(totals, {grid((d + 31) / 32, size.heads_q, size.batch), block, 0, stream});
  // dh_j of every kv block: the GEMM of the marginal mask's transpose and the dH_i (instead of the kv kernel summing
  // its column's listed dH_i from L2).
  const SageSlaMaskGemmColumnsParams columns_gemm{reinterpret_cast<const signed char *>(base + layout.classes),
                                                  halves(layout.dh_rows),
                                                  floats(layout.dh_scales),
                                                  size,
                                                  floats(layout.dh_sums),
                                                  ints(layout.dh_sum_fallback)};
  state_->columns_gemm.launch(columns_gemm,
                              {grid((size.kv_blocks + codegen::kSlaMaskGemmRows - 1) / codegen::kSlaMaskGemmRows,
                                    state_->mask_gemm_column_ctas, static_cast<long long>(size.batch) * size.heads_kv),
                               block, state_->mask_gemm_shared, stream});
  const SageSlaColumnsBackwardParams kv{tensors.q,
                                        tensors.k,
                                        tensors.v,
                                        q_strides,
                                        k_strides,
                                        v_strides,
                                        tensors.d_sparse,
                                        floats(layout.lse),
                                        floats(layout.delta),
                                        halves(layout.dh_rows),
                                        floats(layout.dh_scales),
                                        floats(layout.dz_rows),
                                        floats(layout.dz_total),
                                        floats(layout.dh_sums),
                                        ints(layout.dh_sum_fallback),
                                        ints(layout.critical_columns),
                                        ints(layout.marginal_columns),
                                        ints(layout.non_marginal_columns),
                                        ints(layout.column_counts),
                                        size,
                                        scale,
                                        tensors.dk,
                                        tensors.dv,
                                        ints(layout.sparse_units),
                                        ints(layout.sparse_unit_count),
                                        layout.sparse_unit_items};
  state_->kv_backward.launch(kv, {grid(size.kv_blocks, size.heads_kv, size.batch), block, kv_shared, stream});
  // After the rows and kv kernels, which write dQ, dK and dV (and the kv kernel its work units): it adds to them.
  state_->sparse_fused.launch(sparse, {grid(layout.sparse_unit_capacity, 1, 1),
                                       {static_cast<unsigned>(2 * state_->variant.block_kv), 1, 1},
                                       state_->sparse_fused_shared,
                                       stream});
}

} // namespace sage::runtime
