// The LSE merge of two partial attention results (issue 30) on the GPU: the caller's tensors checked
// (validateMergeCall, no GPU needed), the module of their element types generated (generateMergeModule) and, per
// device and types, compiled once through the kernel cache and launched on the caller's stream (runMerge).
//
//   out = e^(lse_a - L) O_a + e^(lse_b - L) O_b,   lse_out = L = log(e^(lse_a) + e^(lse_b))
//
// exact for masked rows (codegen/device/sage/device/merge/merge.cuh). The output may be O_a itself (the running
// in-place form ring attention uses), lse_out lse_a; nothing written overlaps anything else.
#pragma once

#include "sage/codegen/MergeKernels.h"
#include "sage/runtime/AttentionCall.h"
#include "sage/runtime/AttentionKernelSet.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/TensorDescription.h"
#include "sage/schedules/GpuArch.h"

namespace sage::runtime {

struct MergeCall {
  TensorLayout layout = TensorLayout::hnd;
  TensorDescription o_a, o_b, o_out;       // 4-D in `layout`, one shape; f16, bf16 or f32 each; head_dim stride 1
  TensorDescription lse_a, lse_b, lse_out; // f32 [batch, heads, tokens], any strides
};

struct ValidatedMerge {
  codegen::MergeTypes types;
  SageMergeParams params{};
  int device = 0;
};

// Every rule, each failure an ArgumentError naming the argument: ranks, shapes (the three O alike, each LSE [b, h, n]
// of them), dtypes (O: f16 / bf16 / f32; LSE: f32), one CUDA device, element alignment, a head dim that is a
// multiple of 8 up to codegen::kMergeMaxHeadDim with stride 1, written tensors without self-overlap and no overlap
// between arguments except o_out == o_a and lse_out == lse_a exactly (same address, dtype and strides).
ValidatedMerge validateMergeCall(const MergeCall &call);

// The module for `types` on `arch` (role merge, entry point codegen::kMergeKernel) with its cache key.
GeneratedKernel generateMergeModule(const codegen::MergeTypes &types, schedules::GpuArch arch);

// Launches the merge on `stream` of the tensors' device, loading the module on first use for that device and those
// types (compiled with NVRTC on a kernel-cache miss). Thread-safe. Throws CudaError, CompileError.
void runMerge(const ValidatedMerge &merge, driver::Stream stream);

} // namespace sage::runtime
