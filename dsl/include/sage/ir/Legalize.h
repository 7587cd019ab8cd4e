// Legalization: target-dependent rewrites of a sage program, as an MLIR pass (text in, text out).
//
// A target without a quantized mma gets sage.decode ops in front of that mma: FP4 (e2m1) codes times their
// microscales become f16 (NVFP4) or bf16 (MXFP4), exactly, and multiply in an f16/bf16 mma with f32
// accumulation; int4 codes become int8 codes and multiply in the int8 mma. Every value the mma sees is the one
// the quantized mma would see, so the rewrite is exact: the CPU reference of the legalized program equals the
// original's.
#pragma once

#include "sage/ir/Program.h"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sage::ir {

// What a target's tensor cores multiply natively.
struct TargetCapabilities {
  std::string arch;              // "sm_90a", ...
  bool block_scaled_fp4 = false; // mma ... kind::mxf4nvf4.block_scale (sm_100a, sm_120a)
  bool int4_mma = false;         // mma.sync m16n8k64 .s4 (sm_80 .. sm_89; Hopper and Blackwell dropped INT4)
};

// The targets legalization knows, in arch order; nullopt for another name.
std::optional<TargetCapabilities> targetCapabilities(std::string_view arch);
std::vector<std::string> legalizationTargets();

// The program rewritten for `arch` (a new Program; `program` is unchanged). Throws std::invalid_argument for an
// unknown arch (naming the known ones) and ProgramError if the rewritten program does not verify.
Program legalizeForTarget(const Program &program, std::string_view arch);

} // namespace sage::ir
