// The mma.sync schedule (Ampere's instructions; also the baseline on sm_86, sm_89, sm_90a and newer):
// FlashAttention-2 tiling, one CTA per (Q block, q head, batch), warps split the Q rows, K/V tiles streamed
// through a cp.async multi-stage pipeline, ldmatrix into registers, S and P kept in registers.
//
//   S = Q.K^T   mma m16n8k32 s8.s8.s32 (int8 Q/K; int4 Q/K decoded to int8) or m16n8k16 f16/bf16 with f32
//               accumulate (unquantized Q/K); + the prologue's delta_s when Q is smoothed
//   O += P.V    m16n8k16 f16 (f16 or f32 accumulate), m16n8k32 s8 (s32 per block), m16n8k32 e4m3 (sm_89+)
//   FP4         by emulation (the legalized program): e2m1 codes x microscales decoded exactly to f16 (NVFP4) or bf16
//               (MXFP4) in shared memory, m16n8k16 with f32 accumulation; P microscaled in registers and decoded
#pragma once

#include "sage/schedules/Schedule.h"

#include <optional>
#include <string_view>

namespace sage::schedules {

class Sm80Schedule final : public Schedule {
public:
  static constexpr std::string_view kName = "sm80.mma_sync";

  // What only the sm80 kernel writer emits, beyond the numerics its kernels share with the sm90 schedule's (which
  // asks a default Sm80Schedule for its verdict on the numerics, so a default instance refuses these):
  // Q smoothing (the prologue's delta_s added to S) and int4 Q/K (stored one per byte, multiplied as int8 codes:
  // the s4 -> s8 legalization); FP4 (e2m1) operands by emulation (decoded to f16/bf16: the FP4 legalization). The
  // registry's sm80 schedule has them on.
  struct Extensions {
    bool q_smoothing_and_int4 = false;
    bool fp4_emulation = false;
  };
  Sm80Schedule() = default;
  explicit Sm80Schedule(Extensions extensions) : extensions_(extensions) {}
  // The schedule as registered (every extension on).
  static Sm80Schedule full() { return Sm80Schedule(Extensions{true, true}); }

  std::string_view name() const override { return kName; }
  std::string_view summary() const override;
  // The baseline: every other schedule that runs on an arch ranks above it.
  int preference(GpuArch) const override { return 0; }

  SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType input) const override;

  // Without tunables: defaultTunables(), with the pipeline shortened until the shared memory fits the arch (and,
  // when the registers allow it, until two CTAs share an SM).
  KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                  std::optional<Tunables> tunables = std::nullopt) const override;

  // Warps 4/8/16, stages 2..6, power-of-two block_q and block_kv; each candidate's verdict is plan()'s.
  TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const override;

private:
  Extensions extensions_;
};

} // namespace sage::schedules
