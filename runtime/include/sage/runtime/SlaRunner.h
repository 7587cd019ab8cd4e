// SLA's forward on the GPU (issue 13): the mask prediction (two launches), the linear branch's per-block states
// (one, plus the totals when the marginal blocks are the majority), the variant's sparse part as the block-sparse
// attention kernel of an ordinary AttentionRunner with the predicted critical mask, and the output launch
// (O^l, O = O^s + Proj(O^l)). The SLA kernels are one module, compiled through the kernel cache (options.cache,
// else the process's), or taken from options.aot_directory / $SAGEGEN_AOT_DIR, like the sparse part's. Q, K, V and
// O in options.input (f16 or bf16: a runner for each); Proj's weight [d, d] and bias [d] in f32 on the device.
#pragma once

#include "sage/device/sla/abi.cuh"
#include "sage/runtime/AttentionRunner.h"

#include <cstddef>
#include <memory>

namespace sage::runtime {

struct SlaTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr; // the runner's input type (f16 or bf16)
  SageTensorStrides q_strides{}, k_strides{}, v_strides{};
  void *o = nullptr; // the input type, [b, h_q, n_q, d]: O^s first, then O
  SageTensorStrides o_strides{};
  const float *proj_weight = nullptr; // [d, d] row-major (out, in); null: O stays O^s (the caller applies Proj)
  const float *proj_bias = nullptr;   // [d], or null
  float *o_linear = nullptr;          // O^l [b, h_q, n_q, d] contiguous f32, or null
};

// The backward's inputs and outputs: dO^s (= dO) and dO^l (= dO W, from Proj's owner), f32 contiguous
// [b, h_q, n_q, d]; dQ [b, h_q, n_q, d], dK and dV [b, h_kv, n_kv, d], f32 contiguous, written (not accumulated).
struct SlaBackwardTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr; // as given to run()
  SageTensorStrides q_strides{}, k_strides{}, v_strides{};
  const float *d_sparse = nullptr, *d_linear = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  // The forward's O^s (as run() wrote it to SlaTensors::o with proj_weight null), or null. Given, and where the
  // forward saved the sparse part's L (an exact sparse part, a backward-sized workspace), D^s = rowsum(dO^s o O^s)
  // comes from it (FlashAttention's way) instead of the statistics kernel recomputing the sparse part.
  const void *o_sparse = nullptr;
  SageTensorStrides o_sparse_strides{};
};

// Byte offsets of the SLA workspace's regions (each 256-byte aligned) and its total size. h_states holds f16 h_j / s_j
// with the powers of two s_j at h_scales (abi.cuh's SageSlaStateParams); z_total is f32. h_sums: the mask GEMM's
// H_i (f32, b x h_q x T_m x d x d; the output kernel writes the flagged rows' sums there) and h_sum_fallback its
// flags per q block (SageSlaMaskGemmParams).
struct SlaWorkspaceLayout {
  size_t pooled_q = 0, pooled_k = 0, compressed = 0, classes = 0, critical_mask = 0, critical_lut = 0, linear_lut = 0,
         h_states = 0, h_scales = 0, z_states = 0, z_total = 0, h_sums = 0, h_sum_fallback = 0, attention = 0,
         total = 0;
  // The backward's regions (zero unless the layout was made with backward = true), after the forward's.
  // dh_sums: the backward's mask GEMM's dh_j (f32, b x h_kv x T_n x d x d), dh_sum_fallback its flags per kv block.
  size_t lse = 0, delta = 0, dh_rows = 0, dh_scales = 0, dz_rows = 0, dz_total = 0, dh_sums = 0, dh_sum_fallback = 0,
         critical_columns = 0, marginal_columns = 0, non_marginal_columns = 0, column_counts = 0;
  // H_i (f16, with its power-of-two scale) and Z_i per q block: run() writes them when the workspace is this large,
  // and backward() reads them instead of summing the listed h_j again.
  size_t h_rows = 0, h_row_scales = 0, z_rows = 0;
  // dO^s in the input type (b x h_q x T x d): the sparse part's statistics kernel writes it, its fused kernel reads it.
  size_t d_sparse_f16 = 0;
  // The fused kernel's work units (16 bytes each, sparse_unit_capacity of them: its grid; at most sparse_unit_items
  // critical pairs each) and their count.
  size_t sparse_units = 0, sparse_unit_count = 0;
  long long sparse_unit_capacity = 0;
  int sparse_unit_items = 0;
  // A forward region (4 bytes): run() sets it to 1 where it has the sparse part write its L into `lse` (an exact
  // sparse part, a backward-sized workspace, proj_weight null so that O^s stays in `o`), else 0; backward() reads it
  // on the device (SageSlaSparseDeltaParams).
  size_t lse_saved = 0;
  SageSlaShape shape{};
  bool marginal_majority = false;
};

// SlaBackwardTensors::o_sparse_strides (elements; the head-dim stride is 1): throws std::invalid_argument naming them
// unless the batch and head strides are positive and the token stride is at least shape.head_dim.
void checkSlaSparseOutputStrides(const SageTensorStrides &strides, const schedules::ProblemShape &shape);

class SlaRunner {
public:
  // `variant` must be SLA (sla.enabled); its sparse part runs through an AttentionRunner made with `options`
  // (options.ir_fingerprint: the sparse part's). Throws std::invalid_argument for a non-SLA variant, a head dim the
  // SLA kernels do not take; CompileError, CudaError.
  SlaRunner(const AttentionVariant &variant, AttentionRunnerOptions options);
  ~SlaRunner();
  SlaRunner(const SlaRunner &) = delete;
  SlaRunner &operator=(const SlaRunner &) = delete;

  // Throws std::invalid_argument naming the field for shapes the kernels cannot run (more than 4096 kv blocks).
  // `backward`: also the regions backward() needs (dH_i: b x h_q x T_m x d x d f32, the column tables).
  SlaWorkspaceLayout workspaceLayout(const schedules::ProblemShape &shape, bool backward = false) const;
  size_t workspaceBytes(const schedules::ProblemShape &shape, bool backward = false) const {
    return workspaceLayout(shape, backward).total;
  }

  // Launches everything on `stream`. RunPhase::prologue runs the mask prediction alone (to time it).
  void run(const schedules::ProblemShape &shape, const SlaTensors &tensors, void *workspace, size_t workspace_bytes,
           driver::Stream stream, RunPhase phase = RunPhase::all) const;

  // Algorithm 2 of the exact formula (the sparse part unquantized), after run() on the same workspace (a
  // backward layout, passed to run() with its full size) and inputs: it reads the forward's classes, lookup tables,
  // h_j, z_j and the H_i, Z_i that run() keeps in such a workspace, and the sparse part's L where run() saved it and
  // tensors.o_sparse is given (else a statistics kernel recomputes L and D^s). Throws std::invalid_argument naming
  // tensors.o_sparse_strides where they cannot address O^s [b, h_q, n_q, d].
  void backward(const schedules::ProblemShape &shape, const SlaBackwardTensors &tensors, void *workspace,
                size_t workspace_bytes, driver::Stream stream) const;

  const AttentionRunner &sparsePart() const;
  const AttentionVariant &variant() const;
  schedules::InputType input() const; // options.input: the element type of Q, K, V and O
  // The SLA module and where it came from (memory/disk/built, the compile time when built), then the sparse part's
  // AttentionRunner::describe().
  std::string describe() const;
  CacheSource moduleSource() const; // where the SLA module came from (aot/memory/disk/built)

private:
  struct State;
  std::unique_ptr<State> state_;
};

} // namespace sage::runtime
