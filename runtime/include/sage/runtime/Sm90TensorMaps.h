// The tensor maps of an sm90 (TMA) attention kernel for one call: Q's and K's workspace codes, and V (workspace
// codes, the workspace's f16 copy, or the caller's tensor in place), encoded with cuTensorMapEncodeTiled from the
// plan's boxes (KernelPlan::warp_specialization). What TMA cannot take (a V pointer or stride that is not a
// multiple of 16 bytes, sizes past its 32-bit coordinates) is an std::invalid_argument naming the argument.
#pragma once

#include "sage/codegen/KernelAbi.h"
#include "sage/runtime/TensorMapCache.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/WorkspaceLayout.h"

namespace sage::runtime {

// The caller's V as the sm90 kernel may read it in place.
struct ValueTensor {
  const void *data = nullptr;
  SageTensorStrides strides{}; // elements; the head-dim stride is 1
};

// Checks, without a GPU, that TMA can read the caller's V (ValueSource::input): empty when it can, else the reason.
// Strides of dimensions of size 1 are not looked at (any value is fine there).
std::string valueTensorProblem(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                               const ValueTensor &v);

// The shape V is read in as a tensor map: the problem's, or for a packed plan [1][h_kv][total_kv][d] over the
// packed V (batch stride 0; a sequence's rows start at cu_seqlens_kv[b]); an empty packed V (total_kv 0, never read)
// is encoded as one token so that the map stays valid.
schedules::ProblemShape valueTensorShape(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                                         const SageSequenceOffsets &sequences);

// Whether the plan's kernel claims tiles from WorkspaceLayout::attention_counters (persistent CTAs): the word must be
// zero when it starts (makeSm90AttentionParams then passes it as tile_counter).
bool claimsTiles(const schedules::KernelPlan &plan);

// `base` with the three tensor maps of this call (a packed plan's V map over valueTensorShape(base.sequences)). Throws
// std::invalid_argument (see above) or CudaError. `qk_rows`: the caller's Q and K when they already are in q_codes' and
// k_codes' layout (the prologue skipped: codegen::prologueOnlyCopiesQk), read in place; else both null (the workspace's
// codes). `cache`: where the maps of the previous call are kept (a runner's), so that unchanged ones are not encoded
// again; null encodes all three.
struct QkRows {
  const void *q = nullptr, *k = nullptr;
};
SageSm90AttentionParams makeSm90AttentionParams(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                                                const schedules::WorkspaceLayout &layout,
                                                const SageAttentionParams &base, const ValueTensor &v,
                                                const QkRows &qk_rows = {}, TensorMapCache *cache = nullptr);

} // namespace sage::runtime
