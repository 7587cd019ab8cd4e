// The Blackwell FP4 schedule (sm_120f: RTX 50, RTX PRO 6000, GB10): SageAttention3's microscaled FP4 attention on
// the block-scaled mma.sync of sm_120 (no wgmma, no tensor memory there).
//
//   S = Q.K^T   mma.sync m16n8k64 kind::mxf4nvf4.block_scale (e2m1 x e2m1 -> f32, UE4M3 scales per 16 channels;
//               MXFP4: UE8M0 per 32, scale_vec::2X), + delta_s (Q smoothing's GEMV), in f32
//   softmax     online, base 2; the row max of the tile is reused for P's first-level scale s_P1 = max(P~) / 2688
//   P           quantized in registers: 1x16 UE4M3 microscales along KV, cvt.rn.satfinite.e2m1x2.f32
//   O += P.V    the same block-scaled mma with P from registers and V^T codes (tokens along k) from shared memory
//   pipeline    cp.async, `stages` K/V blocks in flight; each warp owns 16 Q rows
//
// S's accumulator gives lane (g, q) the columns 8j + 2q + {0,1}; P's A operand wants k = 8q + {0..7} and
// 32 + 8q + {0..7}. The kernel therefore reads K's rows in shared memory permuted (fp4ScoreColumnToken), so that
// the accumulator registers are P's A operand as they are (SageAttention3, section 3.3). The prologue writes K in
// natural token order (KernelPlan::k_codes_token_order).
//
// sm_100f (B200/B300) is refused: ptxas 13.0 rejects the block-scaled mma.sync there ("mma with block scale not
// supported on .target sm_100a/sm_100f/sm_103a"); that family's block-scaled FP4 is tcgen05.mma, another schedule.
#pragma once

#include "sage/schedules/Schedule.h"

namespace sage::schedules {

class Sm120Schedule final : public Schedule {
public:
  static constexpr std::string_view kName = "sm120.mma_fp4";

  std::string_view name() const override { return kName; }
  std::string_view summary() const override;
  int preference(GpuArch arch) const override;
  SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType input) const override;
  KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                  std::optional<Tunables> tunables = std::nullopt) const override;
  TunableSpace tunableSpace(const AttentionVariant &variant, GpuArch arch, InputType input) const override;

  // 4 warps of 16 rows (block_q 64) when the variant's block_q allows it, else 8; the variant's block_kv (P's
  // per-tile quantization depends on it); 3 stages, fewer if shared memory is short.
  static Tunables defaultTunables(const AttentionVariant &variant);
};

// The KV token (0-based within its block) whose score lands in column `column` of the kernel's S tile: within
// every 32 columns, column 8j + 2q + r holds token 8q + 2j + r (j < 4: the accumulator's n8 tile, q: the lane's
// position in its quad, r: the register pair). Applied to K's rows in shared memory, it makes the S accumulator of
// one 64-column chunk the A operand of the next m16n8k64 mma (k = 8q + e in registers 0/1, 32 + 8q + e in 2/3).
int fp4ScoreColumnToken(int column);

} // namespace sage::schedules
