// Internal to the attention kernel writers (sm80, sm90, sm120): what a writer derives once from the variant and the
// plan, and the text utilities they share.
#pragma once

#include "sage/codegen/KernelSource.h"
#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/KernelPlan.h"

#include <string>
#include <string_view>

namespace sage::codegen::detail {

// A float as a CUDA literal that round-trips through f32: "127.0f", "0.007874016f", "1e-05f".
std::string floatLiteral(double value);

// What the generator derives once from the variant and the plan.
struct KernelContext {
  const AttentionVariant &variant;
  const schedules::KernelPlan &plan;
  std::string name;
  bool causal = false;
  bool block_sparse = false;
  bool quantized_qk = false;    // int8 Q/K codes with scales
  bool staged_k_scales = false; // K scales vary inside a KV block: staged in shared memory per stage
  bool two_level = false;       // a second, f32 accumulator receives O every flush_period KV blocks
  bool smoothed_v = false;      // mean(V) is added back in the epilogue
  bool smoothed_q = false;      // Q smoothing: the prologue's delta_s (mean(Q_i) . K_j^T) is added to S
  bool lse_correction = false;  // LSE gets q . mean(K) back (K was smoothed)
  bool fp4 = false;             // FP4 by emulation: staged e2m1 codes decoded to 16-bit tiles (PvPath::e2m1_decoded)
};

KernelContext makeContext(const AttentionVariant &variant, const schedules::KernelPlan &plan, std::string name);

// What every writer's KernelSource holds alike: the context's name as the entry point, the plan's block, grid,
// dynamic shared memory and arch, and the device library (the writer adds the source).
KernelSource kernelSourceOf(const KernelContext &context);

// The ValueSource's enumerator name, as the device Configs spell theirs (sm80 ValueSource, sm90 ValueTiles).
std::string_view valueSourceName(schedules::ValueSource source);

} // namespace sage::codegen::detail
