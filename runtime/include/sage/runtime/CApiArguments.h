// The C ABI's arguments turned into validated runner inputs, apart from the handles so that they can be tested
// without a GPU: every C entry point (forward, backward, SLA) goes through these functions, and they apply the shared
// rules of TensorValidation.h (shapes, dtypes, devices, alignment, contiguity, no written tensor overlapping another).
// Each failure is an ArgumentError naming the argument.
#pragma once

#include "sage/ir/SlaSpec.h"
#include "sage/runtime/AttentionBackwardRunner.h"
#include "sage/runtime/SlaRunner.h"
#include "sage/runtime/TensorDescription.h"
#include "sage/runtime/TensorValidation.h"
#include "sage/sage_c.h"
#include "sage/sage_sla_c.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <optional>

namespace sage::runtime::capi {

DataType dataTypeOf(int dtype, const char *argument);
// The description of a required tensor ("<argument>: must not be null" when it is missing).
TensorDescription describe(const sage_tensor_desc *tensor, const char *argument);

// ---- backward (sage_backward_*) ----------------------------------------------------------------------------------
struct BackwardRequirements {
  int head_dim = 128;
  DataType dtype = DataType::f16; // q, k, v, o, d_o, d_q, d_k, d_v
  int device = 0;
};

struct BackwardShape {
  int64_t batch = 0, heads_q = 0, heads_kv = 0, tokens_q = 0, tokens_kv = 0;
};

// q and k as sage_backward_run checks them (sage_backward_workspace_bytes takes the same rules).
BackwardShape validateBackwardInputs(const sage_tensor_desc *q, const sage_tensor_desc *k,
                                     const BackwardRequirements &requirements);

struct ValidatedBackward {
  BackwardTensors tensors;
  MemoryRegions regions; // checkWorkspace adds the workspace
};
ValidatedBackward validateBackwardArgs(const sage_backward_args &args, const BackwardRequirements &requirements);

// ---- SLA (sage_sla_*) ----------------------------------------------------------------------------------------------
// The preset's spec with the configuration's percentages and feature map; NaN, infinities and values out of range are
// refused by name (a value <= 0, or < 0 for negligible_percent, keeps the preset's, as sage_sla_c.h documents).
SlaSpec slaSpecOf(const sage_sla_config &config, SlaSpec preset);

// The SLA object's element type from config.dtype: SAGE_DTYPE_F16 (or 0) or SAGE_DTYPE_BF16; anything else is
// refused naming config.dtype.
DataType slaDataTypeOf(int dtype);

struct SlaRequirements {
  int head_dim = 128;
  int device = 0;
  DataType dtype = DataType::f16; // q, k, v and o_sparse (the SLA object's config.dtype)
};

// q and k: HND contiguous [batch, heads, tokens, head_dim] in requirements.dtype; the problem they describe.
schedules::ProblemShape validateSlaInputs(const sage_tensor_desc *q, const sage_tensor_desc *k,
                                          const SlaRequirements &requirements);

struct ValidatedSlaForward {
  schedules::ProblemShape shape;
  SlaTensors tensors;
  MemoryRegions regions;
};
ValidatedSlaForward validateSlaForwardArgs(const sage_sla_args &args, const SlaRequirements &requirements);

struct ValidatedSlaBackward {
  schedules::ProblemShape shape;
  SlaBackwardTensors tensors;
  MemoryRegions regions;
};
ValidatedSlaBackward validateSlaBackwardArgs(const sage_sla_args &args, const SlaRequirements &requirements);

} // namespace sage::runtime::capi
