// The mma.sync schedule (Ampere's instructions; also the baseline on sm_86, sm_89, sm_90a and newer):
// FlashAttention-2 tiling, one CTA per (Q block, q head, batch), warps split the Q rows, K/V tiles streamed
// through a cp.async multi-stage pipeline, ldmatrix into registers, S and P kept in registers.
//
//   S = Q.K^T   mma m16n8k32 s8.s8.s32 (int8 Q/K) or m16n8k16 f16/bf16 with f32 accumulate (unquantized Q/K)
//   O += P.V    m16n8k16 f16 (f16 or f32 accumulate), m16n8k32 s8 (s32 per block), m16n8k32 e4m3 (sm_89+)
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/InputType.h"
#include "sage/schedules/KernelPlan.h"
#include "sage/schedules/Support.h"
#include "sage/schedules/Tunables.h"

#include <optional>
#include <string_view>

namespace sage::schedules {

class Sm80Schedule {
public:
  static constexpr std::string_view kName = "sm80.mma_sync";

  // Whether this schedule can run `variant` on `arch` for inputs of `input` type; the reason when not.
  static SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType input);

  // The plan for `variant`. Without tunables: defaultTunables(), with the pipeline shortened until the shared
  // memory fits the arch. Throws std::invalid_argument when unsupported (with supports()' reason) or when the
  // given tunables are invalid or do not fit (naming the tunable).
  static KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                         std::optional<Tunables> tunables = std::nullopt);
};

} // namespace sage::schedules
