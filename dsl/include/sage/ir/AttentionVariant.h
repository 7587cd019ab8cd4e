// The normalized, MLIR-free description of one attention variant.
//
// A verified `sage.attention` program is lowered into this struct by `extractVariant` (sage/ir/Extract.h).
// Everything below the IR (the CPU reference, schedules, codegen, runtime keys) reads the variant from
// here, so those layers do not depend on MLIR and the IR has exactly one interpreter of its meaning.
#pragma once

#include "sage/ir/SlaSpec.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sage {

// Version of the IR and of this struct's meaning; part of every cache key.
inline constexpr int kIrVersion = 1;

// Limits of the IR's integer and float attributes, checked by the verifier on the signed 64-bit (or double) value
// before anything narrows it to int.
inline constexpr int64_t kMaxHeadDim = 256;
inline constexpr int64_t kMaxBlockTokens = 1024;    // block_q, block_kv (and so group_tokens)
inline constexpr int64_t kMaxFlushPeriod = 1 << 20; // KV blocks between flushes of a two-level accumulator
// A static scale and its reciprocal stay finite, normal f32 values in the generated kernels.
inline constexpr double kMinStaticScale = 0x1p-64;
inline constexpr double kMaxStaticScale = 0x1p64;

enum class ElementType : uint8_t { f32, f16, bf16, int8, int4, e4m3, e5m2, e2m1 };

enum class Granularity : uint8_t {
  none,            // no scale: a plain cast (f16, bf16, f32)
  per_tensor,      // one scale for the whole tensor (per batch x head)
  per_token,       // one scale per token (row)
  per_block,       // one scale per `group_tokens` consecutive tokens (SageAttention's per-block)
  per_warp,        // one scale per `group_tokens` consecutive tokens, sized to a warp's rows
  per_thread,      // tokens of a `group_tokens` tile interleaved by 8 (token t -> group t mod 8),
                   // matching the rows one mma thread group owns
  per_channel,     // one scale per head-dim channel (V only: the outer axis of P.V)
  microscale_1x16, // one ue4m3 scale per 16 consecutive elements along the matmul's reduction axis (NVFP4):
                   // channels of a Q/K token, KV columns of a P row, tokens of a V channel
  microscale_1x32, // one ue8m0 (power-of-two) scale per 32 such elements (OCP MXFP4, SageAttention3's ablation)
};

// A microscaled quantizer's scales lie along the reduction axis, so they are applied inside the (block-scaled) mma
// rather than by sage.dequant afterwards.
inline bool isMicroscale(Granularity granularity) {
  return granularity == Granularity::microscale_1x16 || granularity == Granularity::microscale_1x32;
}
// Elements sharing one microscale (16 or 32), else 0.
inline int microscaleGroupSize(Granularity granularity) {
  return granularity == Granularity::microscale_1x16 ? 16 : granularity == Granularity::microscale_1x32 ? 32 : 0;
}
// What a target without the block-scaled FP4 mma multiplies instead of microscaled e2m1 codes (the type of the
// legalization's sage.decode): code x microscale, exactly. f16 for NVFP4 (e2m1 x ue4m3 has at most 5 significant bits
// and lies in 2^-10 .. 2688); bf16 for MXFP4 (a ue8m0 scale spans 2^-127 .. 2^127: bf16's exponent range, not f16's).
inline ElementType fp4DecodedType(Granularity granularity) {
  return granularity == Granularity::microscale_1x32 ? ElementType::bf16 : ElementType::f16;
}

enum class ScaleType : uint8_t { f32, ue4m3, ue8m0 };

enum class AccumulatorType : uint8_t { s32, f16, f32 };

// How the P.V partial products are accumulated across KV blocks.
enum class AccumulationKind : uint8_t {
  f32,           // fp32 accumulator
  f16,           // fp16 accumulator only (SageAttention's T/B kernels)
  f16_then_f32,  // fp16 accumulator flushed into an fp32 buffer every `flush_period` KV blocks (two-level)
  f32_two_level, // the mma's fp32 accumulator flushed into a separate fp32 buffer every `flush_period` KV blocks
                 // (SageAttention2: FP8 mma accumulators keep fewer than 32 bits)
};

enum class MaskKind : uint8_t { none, causal, block_sparse };

enum class SmoothScope : uint8_t {
  none,
  sequence, // subtract the mean over all tokens of the sequence (K and V)
  block,    // subtract the mean over the tokens of each quantization block (Q, SageAttention2)
};

enum class TensorRole : uint8_t { q, k, v, p };

struct QuantizerSpec {
  ElementType dtype = ElementType::f32;
  Granularity granularity = Granularity::none;
  int group_tokens = 0; // tokens per scale for per_block / per_warp / per_thread, else 0
  ScaleType scale_type = ScaleType::f32;
  double static_scale = 0.0;       // > 0: a fixed scale (P's 1/127), no scale is computed
  bool two_level = false;          // SageAttention3: per-row f32 scale on top of the microscales
  bool fold_softmax_scale = false; // Q only: multiply by 1/sqrt(d) * log2(e) before quantizing
  // Q and K only, both or neither, with the same seed (issue 28): rotate each token along the head dim by a randomized
  // Hadamard transform before quantizing it (after smoothing). sage/numerics/Hadamard.h defines it bit for bit.
  std::optional<uint32_t> rotation_seed = std::nullopt;

  bool quantized() const { return granularity != Granularity::none || static_scale > 0.0; }
  bool operator==(const QuantizerSpec &) const = default;
};

struct MatmulSpec {
  ElementType a = ElementType::f32;
  ElementType b = ElementType::f32;
  AccumulatorType accumulator = AccumulatorType::f32;
  bool operator==(const MatmulSpec &) const = default;
};

struct AccumulationSpec {
  AccumulationKind kind = AccumulationKind::f32;
  int flush_period = 0; // KV blocks between flushes, two-level kinds only
  bool operator==(const AccumulationSpec &) const = default;
};

struct MaskSpec {
  MaskKind kind = MaskKind::none;
  bool operator==(const MaskSpec &) const = default;
};

struct EpilogueSpec {
  bool write_lse = false;
  bool lse_smoothing_correction = false; // add q . mean(K) back so LSE is that of the unsmoothed logits
  bool operator==(const EpilogueSpec &) const = default;
};

struct AttentionVariant {
  std::string name;
  int version = kIrVersion;
  int head_dim = 128;
  int block_q = 128; // Q tokens per tile (the paper's b_q)
  int block_kv = 64; // K/V tokens per tile (the paper's b_kv)

  SmoothScope smooth_q = SmoothScope::none;
  SmoothScope smooth_k = SmoothScope::none;
  SmoothScope smooth_v = SmoothScope::none;

  QuantizerSpec q, k, p, v;
  MatmulSpec qk, pv;
  bool exp2_softmax = true; // online softmax in base 2 (log2(e) folded into Q's scale)
  AccumulationSpec accumulation;
  MaskSpec mask;
  EpilogueSpec epilogue;
  SlaSpec sla; // SLA (issue 13): when enabled, the fields above describe its sparse part (mask: block_sparse)
  // Variable-length batches (issue 28): the batch is a list of sequences packed along the tokens, sequence b being
  // rows cu_seqlens[b] .. cu_seqlens[b + 1] - 1 of Q (and of K/V by their own offsets). Every statistic "over the
  // sequence" (K smoothing, V's per-channel scales, the causal mask's alignment) is per sequence: one sequence's
  // tokens never reach another's. The variant computes, for each sequence, what the dense variant computes on it.
  bool packed_sequences = false;

  bool operator==(const AttentionVariant &) const = default;
};

// Names are the sage dialect's keywords. (Not `toString`: doctest finds that by ADL and misuses it.)
std::string_view nameOf(ElementType type);
std::string_view nameOf(Granularity granularity);
std::string_view nameOf(ScaleType type);
std::string_view nameOf(AccumulatorType type);
std::string_view nameOf(AccumulationKind kind);
std::string_view nameOf(MaskKind kind);
std::string_view nameOf(SmoothScope scope);
std::string_view nameOf(TensorRole role);

std::optional<ElementType> parseElementType(std::string_view text);
std::optional<Granularity> parseGranularity(std::string_view text);
std::optional<ScaleType> parseScaleType(std::string_view text);
std::optional<AccumulatorType> parseAccumulatorType(std::string_view text);
std::optional<AccumulationKind> parseAccumulationKind(std::string_view text);
std::optional<MaskKind> parseMaskKind(std::string_view text);
std::optional<SmoothScope> parseSmoothScope(std::string_view text);

// Bits of one element when stored (4 for int4/e2m1).
int bitsOf(ElementType type);
bool isInteger(ElementType type);
bool isFloat8(ElementType type);

// SLA (issue 13). Whether the variant's sparse part is the exact formula's in f16 (no quantizer, no smoothing, f32
// accumulation): then its forward's L is the backward's, and the sparse part is compiled to write it (slaSparsePart).
bool slaSparsePartIsExact(const AttentionVariant &variant);
// The sparse part as a variant of its own (the block-sparse attention over the critical blocks that SlaRunner runs):
// `variant` without its SLA fields, writing its LSE where slaSparsePartIsExact. Tools that emit or warm its kernels
// (and their IR fingerprint) use the same.
AttentionVariant slaSparsePart(const AttentionVariant &variant);

// Variable-length batches (issue 28). Why a variant with this mask (and SLA or not) cannot run on packed sequences, or
// empty when it can: the one rule, read by the IR verifier and by packedSequencesOf.
std::string packedSequencesProblem(MaskKind mask, bool sla);
// `dense` computing on packed sequences (packed_sequences = true; the name is kept). Throws std::invalid_argument with
// packedSequencesProblem's reason where packed sequences cannot be.
AttentionVariant packedSequencesOf(const AttentionVariant &dense);

} // namespace sage
