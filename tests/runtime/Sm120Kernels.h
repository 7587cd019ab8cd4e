// The sm120 FP4 kernels the compile and SASS tests build: every FP4 preset x head_dim 64/128 x mask x input, each
// planned by the sm120 schedule on sm_120f, and the NVRTC request that compiles one with the device library.
#pragma once

#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/DeviceLibrary.h"
#include "sage/runtime/NvrtcCompiler.h"
#include "sage/schedules/Sm120Schedule.h"

#include "../codegen/TestVariants.h"
#include "../support/SweepSubset.h"

#include <string>
#include <vector>

namespace sage::test {

struct Sm120Kernel {
  AttentionVariant variant;
  schedules::KernelPlan plan;
  codegen::KernelSource source;
  // The PTX spelling of its block-scaled mma, and how many the unrolled kernel issues: Q.K^T (block_kv / 8) x
  // (d / 64), P.V (d / 8) x (block_kv / 64).
  std::string mma;
  size_t mma_count = 0;
};

// Every preset x head dim x mask x input with SAGEGEN_FULL_SWEEPS; in CI a quarter of each preset's combinations, both
// head dims among them (../support/SweepSubset.h).
inline std::vector<Sm120Kernel> sm120Kernels() {
  const schedules::Sm120Schedule schedule;
  std::vector<Sm120Kernel> kernels;
  const char *presets[] = {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4"};
  for (int p = 0; p < 3; ++p)
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (schedules::InputType input : {schedules::InputType::f16, schedules::InputType::bf16}) {
          const int combination = (head_dim == 128 ? 4 : 0) + (mask == MaskKind::causal ? 2 : 0) +
                                  (input == schedules::InputType::bf16 ? 1 : 0);
          if (!sweepIncludes(p, 0, combination, 4))
            continue;
          const char *preset = presets[p];
          Sm120Kernel kernel;
          kernel.variant = presetVariant(preset, head_dim, mask, true);
          kernel.plan = schedule.plan(kernel.variant, schedules::GpuArch::sm120f, input);
          kernel.source = codegen::AttentionKernelGenerator::generate(kernel.variant, kernel.plan, input);
          kernel.mma = kernel.plan.fp4_scale_group == 16
                           ? "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1."
                             "e2m1.f32.ue4m3"
                           : "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::2X.f32.e2m1."
                             "e2m1.f32.ue8m0";
          const int block_kv = kernel.plan.tunables.block_kv;
          kernel.mma_count = static_cast<size_t>(block_kv / 8 * (head_dim / 64) + head_dim / 8 * (block_kv / 64));
          kernels.push_back(std::move(kernel));
        }
  return kernels;
}

inline runtime::CompileRequest sm120CompileRequest(const codegen::KernelSource &kernel, const std::string &arch) {
  runtime::CompileRequest compile;
  compile.key = kernel.name;
  compile.source = kernel.source;
  compile.options.arch = arch;
  compile.options.report_resources = true;
  for (const codegen::DeviceHeader &header : codegen::deviceLibrary())
    compile.headers.emplace_back(std::string(header.name), std::string(header.text));
  return compile;
}

inline size_t countOccurrences(const std::string &text, const std::string &word) {
  size_t found = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1))
    ++found;
  return found;
}

} // namespace sage::test
