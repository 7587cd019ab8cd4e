// The Hopper schedule (sm_90a): warp-specialised wgmma + TMA, the FlashAttention-3 recipe applied to
// SageAttention's quantized matmuls.
//
//   one producer warpgroup   TMA loads of Q_i (once) and K_j, V_j into `stages` shared-memory stages, mbarriers
//   C consumer warpgroups    64 Q rows each: S = Q K^T (wgmma s8.s8.s32, or f16/bf16 -> f32, both operands in shared
//                            memory), dequantization, online softmax in registers, O += P~ V (wgmma with P~ from
//                            registers: e4m3/s8 against V^T codes, or f16 against V read MN-major)
//   setmaxnreg               the producer gives its registers to the consumers
//
// Tunables: warps = consumer warps (4 per consumer warpgroup: 4, 8 or 12), block_q = 16 x warps (64 rows per
// consumer), block_kv = 64 or 128 (the N of S's wgmma), stages = K/V stages in flight (2..8, as shared memory allows).
// What it computes is decided by the same quantizer checks as the sm80 schedule (the numerics are identical); what
// it adds is the instruction set and the pipeline.
#pragma once

#include "sage/schedules/Schedule.h"

namespace sage::schedules {

class Sm90Schedule final : public Schedule {
public:
  static constexpr std::string_view kName = "sm90.wgmma_tma";

  std::string_view name() const override { return kName; }
  std::string_view summary() const override;
  int preference(GpuArch arch) const override;
  SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType input) const override;
  KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                  std::optional<Tunables> tunables = std::nullopt) const override;
  TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const override;

  // The defaults on sm_90a: 2 consumer warpgroups (block_q 128), block_kv 128 (64 for int8 P.V at d = 128), as
  // many stages as fit up to 4.
  static Tunables defaultTunables(const AttentionVariant &variant);
};

} // namespace sage::schedules
