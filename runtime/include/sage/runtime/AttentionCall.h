// One attention call as a caller describes it (validated tensor descriptions), what a kernel requires of it, and
// the one function that checks the first against the second. Everything a caller can get wrong is checked here,
// before any pointer reaches a kernel: shapes and their agreement (batch, heads, tokens, head dim, GQA), element
// types, devices, the alignment and strides the kernels need, the optional LSE and block mask, and the limits of
// the launch grid and of the kernels' 32-bit counters, and that nothing written overlaps anything else. Each error is
// an ArgumentError naming the argument.
#pragma once

#include "sage/codegen/KernelAbi.h"
#include "sage/runtime/TensorDescription.h"
#include "sage/runtime/TensorValidation.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <cstdint>
#include <optional>
#include <string_view>

namespace sage::runtime {

// HND: [batch, heads, tokens, head_dim]; NHD: [batch, tokens, heads, head_dim].
enum class TensorLayout { hnd, nhd };
std::string_view nameOf(TensorLayout layout); // "HND", "NHD"

// Which keys a causal query row sees when tokens_q != tokens_kv. bottom_right (FlashAttention, the kernels'
// historical rule): query i sees key j iff j <= i + tokens_kv - tokens_q. top_left (PyTorch SDPA's is_causal and
// SageAttention's sageattn): iff j <= i. Equal lengths: the same mask.
enum class CausalAlignment { bottom_right, top_left };
std::string_view nameOf(CausalAlignment alignment); // "bottom-right", "top-left"
int64_t causalOffset(CausalAlignment alignment, int64_t tokens_q, int64_t tokens_kv);

// Raw device pointers and strides (AttentionRunner::run's input once validated).
struct AttentionTensors {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  SageTensorStrides q_strides{}, k_strides{}, v_strides{};
  void *o = nullptr;
  SageTensorStrides o_strides{};
  float *lse = nullptr;                      // [b, h_q, n_q], or null
  const unsigned char *block_mask = nullptr; // [b, h_q, q_blocks, kv_blocks], or null
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;
  // Packed calls (VarlenCall.h) only: cu_seqlens and the packed token counts; the strides above then have batch
  // stride 0 and a sequence's rows start at its offset. All zero for dense calls.
  SageSequenceOffsets sequences{};
};

struct AttentionCall {
  TensorLayout layout = TensorLayout::hnd;
  TensorDescription q, k, v;                   // 4-D, `layout`; k and v [b, h_kv, n_kv, d] (HND)
  TensorDescription o;                         // q's shape and dtype
  std::optional<TensorDescription> lse;        // f32 [b, h_q, n_q], contiguous; required iff the kernel writes it
  std::optional<TensorDescription> block_mask; // u8/bool [b, h_q, q_blocks, kv_blocks], contiguous
  CausalAlignment causal_alignment = CausalAlignment::bottom_right;
};

// What one runner's kernels accept (AttentionRunner::requirements()).
struct KernelRequirements {
  int head_dim = 128;
  schedules::InputType input = schedules::InputType::f16;
  bool writes_lse = false;
  bool block_sparse = false; // reads a block mask (optional: none means every block)
  int block_q = 128;         // the block mask's granularity
  int block_kv = 64;
  int device = 0; // the CUDA device the kernels are loaded on
};

struct ValidatedCall {
  schedules::ProblemShape shape;
  AttentionTensors tensors;
  MemoryRegions regions; // every tensor's span (disjoint where written): checkWorkspace adds the workspace's
};

// Throws ArgumentError naming the first argument that does not fit `requirements`.
ValidatedCall validateAttentionCall(const AttentionCall &call, const KernelRequirements &requirements);

// The problem shape of q and k alone (for workspace sizes), checked as validateAttentionCall checks them.
schedules::ProblemShape problemShapeOf(const TensorDescription &q, const TensorDescription &k, TensorLayout layout,
                                       const KernelRequirements &requirements);

} // namespace sage::runtime
