// The device helpers the prologue's role functions call (tile loads, statistics, Q smoothing's GEMV, FP4 tiles,
// V codes), emitted only for the roles a kernel has (PrologueRoleSources.cpp emits the role functions themselves).
// They are the device library's (sage/device/prologue/*.cuh), pasted; the generator adds what the variant decides
// (the QBlock and KTile aliases, the VQuantizer struct).
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/PrologueDeviceCode.h"
#include "sage/numerics/Hadamard.h"

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace sage::codegen::prologue {
namespace {

bool has(const std::vector<PrologueRole> &roles, PrologueRole role) {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

// One Q block of kBlockQ tokens in registers, and the x that psi_Q quantizes.
std::string qBlockSupport(const PrologueConfig &config) {
  std::string text = pasteDeviceHeader("sage/device/prologue/q_block.cuh");
  text += "// The x that psi_Q quantizes";
  text += config.fold_q_scale || config.smooth_q ? ":\n" : " (Q itself).\n";
  if (config.fold_q_scale)
    text += "//   x = Q * q_prescale: the softmax scale 1/sqrt(d) * log2(e) folded into psi_Q (paper 4.6), one f32 "
            "multiply\n";
  if (config.smooth_q)
    text += "//   x = x - mean of the block's x per channel: Q smoothing (SageAttention2), one f32 subtraction\n";
  text += "using QBlock = sage::device::prologue::QBlockOf<" + std::string(config.fold_q_scale ? "true" : "false") +
          ", " + (config.smooth_q ? "true" : "false") + ">;\n";
  return text;
}

// kKBlocksPerTile KV blocks of K in registers, and the x that psi_K quantizes (K, or gamma(K) when K is smoothed).
std::string kBlockSupport(const PrologueConfig &config) {
  return pasteDeviceHeader("sage/device/prologue/k_tile.cuh") + "using KTile = sage::device::prologue::KTileOf<" +
         (config.smooth_k ? "true" : "false") + ">; // " + (config.smooth_k ? "gamma(K) = K - mean(K)" : "K itself") +
         "\n";
}

// Q smoothing's correction, written by the K tiles (launch 2, after launch 1's q_mean): the GEMV of
// sage.q_mean_correction.
std::string qMeanCorrectionSupport() {
  return pasteDeviceHeader("sage/device/prologue/q_mean_correction.cuh") +
         "using sage::device::prologue::writeQMeanCorrection;\n";
}

// Microscaled (FP4) Q and K: the codes and scales of a tile's rows.
std::string microscaledTileSupport() {
  return pasteDeviceHeader("sage/device/prologue/microscaled_tile.cuh") +
         "using sage::device::prologue::storeMicroscaledTile;\n";
}

// mean(K) and/or the per-tensor psi_K's amax over the whole sequence (the role names the variant's
// combineKStatistics<smoothed, min/max>).
std::string kStatisticsSupport() { return pasteDeviceHeader("sage/device/prologue/k_statistics.cuh"); }

// mean(V) and/or psi_V's per-channel scales over the whole sequence (the roles name the variant's combineVStatistics).
std::string vStatisticsSupport() { return pasteDeviceHeader("sage/device/prologue/v_statistics.cuh"); }

// The variant's per-channel psi_V (struct VQuantizer: qmax and the code of x * inverse), the transposed tile's
// swizzle and, for wgmma-ordered v_codes, the token order.
std::string vCodeSupport(const PrologueConfig &config) {
  const bool e4m3 = config.v_dtype == ElementType::e4m3;
  std::string text = "\n// Per-channel psi_V: ";
  text += e4m3 ? "e4m3 codes, scale = amax / 448" : "int8 codes, scale = amax / 127";
  text += " over all tokens of the channel (paper 4.3).\n";
  text += "struct VQuantizer {\n";
  text += std::string("  static constexpr float kCodeMax = ") + (e4m3 ? "448.0f" : "127.0f") + ";\n";
  text += std::string("  static __device__ __forceinline__ unsigned code(float scaled) { return ") +
          (e4m3 ? "e4m3Code" : "int8Code") + "(scaled); }\n";
  text +=
      std::string("  static __device__ __forceinline__ unsigned codes4(float a, float b, float c, float d) { return ") +
      (e4m3 ? "e4m3Codes4" : "int8Codes4") + "(a, b, c, d); }\n};\n";
  text += pasteDeviceHeader("sage/device/prologue/v_codes.cuh");
  if (config.interleavedVCodes())
    text += pasteDeviceHeader("sage/device/prologue/v_token_order.cuh");
  return text;
}

// The randomized Hadamard rotation of Q and K (issue 28): the variant's signs and powers of two as constants, then
// rotateTile. The values are sage/numerics/Hadamard.h's, computed here from the seed.
std::string rotationSupport(const PrologueConfig &config) {
  const uint32_t seed = *config.rotation_seed;
  const auto signs = numerics::hadamardSigns(seed);
  std::string text = "\n// ---- Q and K rotated before psi: x R, R = H D 2^-e (issue 28; seed " + std::to_string(seed) +
                     ", sage/numerics/Hadamard.h) ----\n";
  for (size_t word = 0; word < signs.size(); ++word)
    text += fmt::format("[[maybe_unused]] constexpr unsigned long long kRotationSigns{} = 0x{:016x}ull; // D: channels "
                        "{}-{}, bit c % 64 negates c\n",
                        word, signs[word], 64 * word, 64 * word + 63);
  for (bool for_k : {false, true})
    text += fmt::format("[[maybe_unused]] constexpr float kRotationScale{} = {}f; // 2^-{}\n", for_k ? "K" : "Q",
                        std::ldexp(1.0, -numerics::hadamardScaleExponent(config.head_dim, for_k)),
                        numerics::hadamardScaleExponent(config.head_dim, for_k));
  return text + pasteDeviceHeader("sage/device/prologue/rotation.cuh");
}

} // namespace

std::string emitRoleSupport(const PrologueConfig &config, const std::vector<PrologueRole> &roles) {
  std::string text;
  if (has(roles, PrologueRole::q_block_quantize) || has(roles, PrologueRole::q_block_statistics))
    text += qBlockSupport(config);
  // Only where a role rotates (PrologueRotation.h keeps rotated variants to the per-group psi_Q and psi_K).
  if (config.rotation_seed &&
      (has(roles, PrologueRole::q_block_quantize) || has(roles, PrologueRole::k_block_quantize)))
    text += rotationSupport(config);
  // The psi_Q roles, by what they need: a per-tensor scale reads the statistics scratch, FP4 the microscaled tile.
  if (has(roles, PrologueRole::q_block_quantize) && config.q.cast())
    text += pasteDeviceHeader("sage/device/prologue/q_cast.cuh");
  else if (has(roles, PrologueRole::q_block_quantize) && !config.q.perTensor() && !config.q.microscaled())
    text += pasteDeviceHeader("sage/device/prologue/q_quantize.cuh") +
            (config.rotation_seed ? pasteDeviceHeader("sage/device/prologue/q_rotated_quantize.cuh") : "");
  if (config.q.perTensor() &&
      (has(roles, PrologueRole::q_block_quantize) || has(roles, PrologueRole::q_block_statistics)))
    text += pasteDeviceHeader("sage/device/prologue/q_per_tensor.cuh");
  if (has(roles, PrologueRole::k_block_quantize))
    text += kBlockSupport(config);
  if (has(roles, PrologueRole::k_block_quantize) && config.kStatistics())
    text += kStatisticsSupport();
  if (has(roles, PrologueRole::k_block_quantize) && config.smooth_q)
    text += qMeanCorrectionSupport();
  if ((has(roles, PrologueRole::q_block_quantize) && config.q.microscaled()) ||
      (has(roles, PrologueRole::k_block_quantize) && config.k.microscaled()))
    text += microscaledTileSupport();
  if (has(roles, PrologueRole::q_block_quantize) && config.q.microscaled())
    text += pasteDeviceHeader("sage/device/prologue/q_fp4_quantize.cuh");
  if (has(roles, PrologueRole::k_block_quantize)) // after every step of the role that the variant has
    text += pasteDeviceHeader("sage/device/prologue/k_quantize.cuh");
  const bool v_quantize = has(roles, PrologueRole::v_tile_quantize) && config.v_output == VOutput::codes;
  if (v_quantize)
    text += vCodeSupport(config);
  if (v_quantize || (has(roles, PrologueRole::v_tile_convert) && config.smooth_v))
    text += vStatisticsSupport();
  if (has(roles, PrologueRole::v_tile_quantize) || has(roles, PrologueRole::v_tile_convert))
    text += pasteDeviceHeader("sage/device/prologue/v_tile.cuh");
  if (has(roles, PrologueRole::v_tile_convert))
    text += pasteDeviceHeader("sage/device/prologue/v_convert.cuh");
  if (has(roles, PrologueRole::v_tile_quantize))
    text += pasteDeviceHeader(v_quantize ? "sage/device/prologue/v_quantize.cuh"
                                         : "sage/device/prologue/v_fp4_quantize.cuh");
  return text;
}

} // namespace sage::codegen::prologue
