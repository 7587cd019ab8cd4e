// The knobs of a schedule that do not change what is computed, only how fast: tile sizes, warps, and the
// depth of the cp.async pipeline. They are part of every kernel's cache key (tunablesText).
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/GpuArch.h"

#include <optional>
#include <string>
#include <string_view>

namespace sage::schedules {

struct Tunables {
  int block_q = 128; // Q rows per CTA (the paper's b_q)
  int block_kv = 64; // K/V tokens per main-loop step (b_kv)
  int warps = 4;     // warps per CTA; they split the Q rows
  int stages = 3;    // K/V tiles in flight in the cp.async pipeline (shared-memory buffers)
  // sm90 only: no producer warpgroup; a consumer thread issues the TMA loads (smaller CTAs, more of them per SM)
  bool inline_loads = false;
  // sm90 inline loads only: the CTAs per SM that __launch_bounds__ caps the registers for (0: the schedule's choice)
  int ctas = 0;
  bool operator==(const Tunables &) const = default;
};

// The paper's Table 12 (head_dim 64: 4 warps, 3 stages, 4 when causal; head_dim 128: 8 warps, 3 stages, 5 when
// causal) with the variant's own b_q and b_kv: head dims up to 64 get the 64 row (with 8 warps below 64), up to 128
// the 128 row; beyond 128, 4 warps, b_q at most 64 and b_kv at most 32 (registers and shared memory; Tunables.cpp).
Tunables defaultTunables(const AttentionVariant &variant);

// The schedule's defaults on `arch`: Table 12, except where measurements say otherwise (sm_90a, head_dim 128 with
// integer Q.K^T and f16/int8 P.V: 4 warps and 2 stages; see Tunables.cpp). A tuning database entry overrides these.
Tunables defaultTunables(const AttentionVariant &variant, GpuArch arch);

// "block_q=128,block_kv=64,warps=8,stages=3": canonical, for cache keys and logs (",inline_loads=1" and ",ctas=N"
// only when set, so that the keys of every other plan stay what they were).
std::string tunablesText(const Tunables &tunables);

// Parses tunablesText's form; every field is optional and starts from `base`. Throws std::invalid_argument naming
// the field on malformed text.
Tunables parseTunables(std::string_view text, const Tunables &base);

} // namespace sage::schedules
