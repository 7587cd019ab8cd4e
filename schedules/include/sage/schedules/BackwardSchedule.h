// Backward schedules (SageBwd, issue 12): how a BackwardVariant is computed on one GPU family. The backward's
// counterpart of Schedule.h (whose interface takes forward AttentionVariants): one class per architecture family,
// registered in one list (allBackwardSchedules(), BackwardScheduleRegistry.cpp), each with a writer in codegen
// (BackwardKernelGenerator.h) that reads only the plan.
#pragma once

#include "sage/ir/BackwardVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/Support.h"

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sage::schedules {

// A backward launch's grid: x over 64-token blocks of Q (or K/V), or over slices of each KV head's tokens (K
// smoothing's column sums), y over heads (query or KV), z over the batch.
enum class BackwardGrid { q_blocks, kv_blocks, kv_slices };

struct BackwardLaunch {
  std::string entry_point; // the extern "C" kernel; takes one SageBackwardParams by value
  BackwardGrid grid = BackwardGrid::q_blocks;
  int dynamic_shared_bytes = 0; // above 48 KiB needs the opt-in attribute
  int threads = 128;            // per CTA
  int tile_tokens = 64;         // tokens of the grid's axis per CTA (q_blocks: queries, kv_blocks: keys)
  int slices = 0;               // kv_slices: slices per KV head, fewer where K has fewer 64-token blocks
  // {blocks, heads, batch} of this launch for a shape.
  std::array<int64_t, 3> gridFor(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q,
                                 int64_t tokens_kv) const;
};

struct BackwardKernelPlan {
  std::string schedule; // the BackwardSchedule::name() that planned it
  GpuArch arch = GpuArch::sm80;
  InputType input = InputType::f16;
  int head_dim = 128;
  int block_q = 64, block_kv = 64, warps = 4; // the quantization blocks; warps of the main kernel
  int kv_tile = 64; // keys per CTA of the main kernel: one or two K blocks (as the arch's shared memory allows)
  // The preprocess writes the Q-side tiles in the main kernel's shared-memory byte order, with a copy of dO, for bulk
  // copies (the wgmma schedule); the workspace then holds do_tiles.
  bool bulk_tiles = false;
  bool causal = false;
  // K smoothing (variant.smooth_k): the first launch sums K's columns per slice (k_sums), the preprocess subtracts
  // mean(K) from K and shifts each query row's LSE by q . mean(K) / sqrt(d); the main kernels are unchanged.
  bool smooth_k = false;
  // The randomized Hadamard rotation of Q and K (issue 25; the variant's Q and K quantizers' one seed): the preprocess
  // quantizes Q R_Q and K R_K, write_dq and the main kernel's epilogue rotate dQ and dK back; no launch is added.
  std::optional<uint32_t> rotation_seed;
  // P (for dV) and dS (for dK) with one int8 scale per key of the 64-query tile instead of one per tile (issue 25:
  // the variant's per_token P and dK operand).
  bool key_scales = false;
  // dS for dQ with one int8 scale per query of the 64-key block instead of one per tile (issue 25: the variant's
  // per_token dQ operand); the scale factors out of dQ's row, so the kernels apply it to the product's output rows.
  bool query_scales = false;
  std::vector<BackwardLaunch> launches; // in launch order, on one stream
  std::string describe() const;         // one line for logs
};

// Bytes of the backward's workspace (the SageBackwardParams workspace pointers, in their order) for a shape.
struct BackwardWorkspaceSizes {
  int64_t q_codes = 0, k_codes = 0, do_codes = 0; // each of the natural and the transposed copy
  int64_t q_scales = 0, k_scales = 0, do_scales = 0;
  int64_t row_stats = 0, dq_accum = 0;
  int64_t do_tiles = 0; // plan.bulk_tiles only
  int64_t k_sums = 0;   // plan.smooth_k only: f32 [batch, heads_kv, slices, head_dim]
  int64_t total() const {
    return 2 * q_codes + 2 * k_codes + do_codes + q_scales + k_scales + do_scales + row_stats + dq_accum + do_tiles +
           k_sums;
  }
};
BackwardWorkspaceSizes backwardWorkspaceSizes(const BackwardKernelPlan &plan, int64_t batch, int64_t heads_q,
                                              int64_t heads_kv, int64_t tokens_q, int64_t tokens_kv);

// SageBwd's plan as both schedules launch it: the variant's facts, `keys` per main-kernel CTA with `warps` warps and
// `main_shared_bytes` of dynamic shared memory (checked against the arch's limit), and the launches (k_sums where K
// is smoothed, preprocess_q, preprocess_k, main, write_dq). Throws std::invalid_argument when the shared memory does
// not fit.
BackwardKernelPlan sageBwdPlan(std::string_view schedule, const BackwardVariant &variant, GpuArch arch, InputType input,
                               int keys, int warps, int main_shared_bytes);

class BackwardSchedule {
public:
  virtual ~BackwardSchedule() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  virtual SupportResult supports(const BackwardVariant &variant, GpuArch arch, InputType input) const = 0;
  // Throws std::invalid_argument with supports()' reason when unsupported.
  virtual BackwardKernelPlan plan(const BackwardVariant &variant, GpuArch arch, InputType input) const = 0;
};

// "sm80.mma_sync_backward": SageAttention3's Algorithm 3 on mma.sync (sm_80 and every later arch here). See
// codegen/device/sage/device/sm80/backward.cuh for the kernels and the dQ strategy.
class Sm80BackwardSchedule final : public BackwardSchedule {
public:
  std::string_view name() const override { return "sm80.mma_sync_backward"; }
  std::string_view summary() const override;
  SupportResult supports(const BackwardVariant &variant, GpuArch arch, InputType input) const override;
  BackwardKernelPlan plan(const BackwardVariant &variant, GpuArch arch, InputType input) const override;
};

// "sm90.wgmma_backward": the same algorithm and numerics as the mma.sync schedule on sm_90a's warpgroup MMA: one CTA
// of two warpgroups per 128 keys, each warpgroup a 64-key block. See codegen/device/sage/device/sm90/backward.cuh.
class Sm90BackwardSchedule final : public BackwardSchedule {
public:
  std::string_view name() const override { return "sm90.wgmma_backward"; }
  std::string_view summary() const override;
  SupportResult supports(const BackwardVariant &variant, GpuArch arch, InputType input) const override;
  BackwardKernelPlan plan(const BackwardVariant &variant, GpuArch arch, InputType input) const override;
};

// The schedules in preference order: the first that supports a variant on an arch is the best.
const std::vector<const BackwardSchedule *> &allBackwardSchedules();
// The first schedule of the list that supports the variant; throws std::invalid_argument listing each reason.
const BackwardSchedule &bestBackwardSchedule(const BackwardVariant &variant, GpuArch arch, InputType input);

} // namespace sage::schedules
