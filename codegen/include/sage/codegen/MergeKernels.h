// The LSE merge kernel (issue 30): one CUDA translation unit per (O_a, O_b, out) element types holding one extern "C"
// kernel around the device library's template (sage/device/merge/merge.cuh); parameter block:
// sage/device/merge/abi.cuh (plain C, included by host and device). Ring attention merges each step's partial
// (O, LSE) into its accumulator with it; runtime/MergeRunner compiles and launches it.
#pragma once

#include "sage/device/merge/abi.cuh"

#include <string>
#include <string_view>

namespace sage::codegen {

enum class MergeElement { f16 = SAGE_MERGE_F16, bf16 = SAGE_MERGE_BF16, f32 = SAGE_MERGE_F32 };
std::string_view nameOf(MergeElement element); // "f16", "bf16", "f32"

struct MergeTypes {
  MergeElement a = MergeElement::f32, b = MergeElement::f32, out = MergeElement::f32;
  bool operator==(const MergeTypes &) const = default;
};

inline constexpr std::string_view kMergeKernel = "sage_merge_attention"; // grid mergeGridCtas(rows), kMergeThreads
inline constexpr int kMergeThreads = 256;
// CTAs per SM the kernel is compiled for (at most 64 registers): with the thread count alone, ptxas held some type
// triples to 48 registers and spilled (f16 with bf16 parts on sm_80).
inline constexpr int kMergeMinBlocks = 4;
inline constexpr int kMergeMaxHeadDim = 1024; // the widest row the runner takes (a warp loops over it)

struct MergeKernelSource {
  std::string name;   // sage_merge_a_f32_b_bf16_o_f32
  std::string source; // #includes sage/device/merge/merge.cuh
};

MergeKernelSource generateMergeKernel(const MergeTypes &types);

// CTAs for `rows` rows of `head_dim` (every row gets its lanes; the kernel's loop takes any rows beyond the cap).
unsigned mergeGridCtas(long long rows, int head_dim);

} // namespace sage::codegen
