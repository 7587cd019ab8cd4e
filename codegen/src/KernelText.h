// Internal to the attention kernel generator: the pieces of one generated translation unit, each emitted by
// its own file, and the small text utilities they share.
#pragma once

#include "sage/ir/AttentionVariant.h"
#include "sage/schedules/KernelPlan.h"

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace sage::codegen::detail {

// Replaces every @NAME@ in `text` with its value. Throws std::logic_error for a placeholder without a value, so a
// typo in a template cannot reach the compiler.
std::string substitute(std::string_view text, std::initializer_list<std::pair<std::string_view, std::string>> values);

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

std::string emitHeaderComment(const KernelContext &context);
std::string emitConstants(const KernelContext &context);
std::string emitInstructionWrappers(const KernelContext &context);
std::string emitTileHelpers(const KernelContext &context);
std::string emitScoreSteps(const KernelContext &context);
std::string emitSoftmaxSteps(const KernelContext &context);
std::string emitValueSteps(const KernelContext &context);
std::string emitEpilogueSteps(const KernelContext &context);
std::string emitKernelEntry(const KernelContext &context);

// FP4 by emulation (KernelFp4Steps.cpp): its constants, the #include of sage/device/sm80/fp4_steps.cuh with
// `using Fp4Steps` (the decode of staged tiles, P~'s microscaling, the P.V product), and `using ValueSteps`.
std::string fp4Constants(const KernelContext &context);
std::string emitFp4DecodeSteps(const KernelContext &context);
std::string emitFp4ValueSteps(const KernelContext &context);

} // namespace sage::codegen::detail
