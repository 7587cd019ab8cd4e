// sagegen quantization prologue, launch 2 of 2: sage_prologue_quantize_after_statistics. Generated code.
// Variant "sage-vt" (IR v1): Q, K, V in f16, head_dim 128, b_q 128, b_kv 64.
//   psi_Q: int8 per_token of Q * 1/sqrt(d) * log2(e) (softmax scale folded in, paper 4.6)
//   phi_K = psi_K o gamma: gamma(K) = K - mean(K) over the sequence (paper 4.2); psi_K: int8 per_token
//   psi_V: per-channel int8 of V, codes transposed (paper 4.3)
//   v_codes' token axis in wgmma order: position p of each 32-token group holds token
//     16 (p / 16) + 8 ((p % 4) / 2) + 2 ((p % 16) / 4) + p % 2
// Launches, in order on one stream, all with the same SagePrologueParams:
//   1. sage_prologue_read_inputs (first read of Q, K and V):
//        K column statistics per slice (batch * heads_kv * slices CTAs)
//        V column statistics per slice (batch * heads_kv * slices CTAs)
//        psi_Q per Q block (batch * heads_q * ceil(tokens_q / b_q) CTAs)
//   2. sage_prologue_quantize_after_statistics (second read: quantize with the statistics of the whole sequence):
//        phi_K = psi_K o gamma per 2 KV block(s) (batch * heads_kv * ceil(tokens_kv / (2 * b_kv)) CTAs)
//        per-channel psi_V per V tile (batch * heads_kv * ceil(padded_kv / 128) CTAs)
// This launch: blockDim.x = kThreads, gridDim.x = phi_K = psi_K o gamma per 2 KV block(s) (batch * heads_kv *
//   ceil(tokens_kv / (2 * b_kv)) CTAs) + per-channel psi_V per V tile (batch * heads_kv * ceil(padded_kv / 128)
//   CTAs).

// The parameter blocks of the generated kernels. This file is compiled by the host compiler AND
// pasted verbatim at the top of every generated kernel source (see kernelAbiSource()), so host and
// device agree on the layout by construction. Keep it plain C: no includes, no templates, fixed-size
// fields, pointers and 64-bit offsets only. Strides are in elements; offsets are in bytes from the
// workspace base and follow sage::schedules::WorkspaceLayout.
#ifndef SAGE_KERNEL_ABI_H
#define SAGE_KERNEL_ABI_H

struct SageWorkspaceOffsets {
  unsigned long long q_codes, q_scales, k_codes, k_scales, k_mean, q_mean;
  unsigned long long v_values, v_codes, v_scales, v_mean;
  unsigned long long delta_s; // Q smoothing's correction of S [b, h_q, q_blocks, padded_kv] (WorkspaceLayout.h)
};

struct SageTensorStrides {
  long long batch, head, token; // elements; the head-dim stride is 1
};

struct SageLseStrides {
  long long batch, head; // elements; the token stride is 1
};

struct SageProblemSize {
  int batch, heads_q, heads_kv, tokens_q, tokens_kv;
  int padded_q, padded_kv;          // tokens rounded up to the block sizes
  int q_scale_count, k_scale_count; // scales per (batch, head)
};

// Variable-length batches (KernelPlan::packed_sequences; both pointers 0 for dense kernels). Sequence b of Q is rows
// q[b] .. q[b + 1] - 1 of the caller's packed Q, O and LSE ([total_q, heads, d], batch stride 0), and of K/V by kv[].
// SageProblemSize then holds batch = the number of sequences and tokens_q / tokens_kv = the call's maximum lengths
// (the workspace's dense layout; a sequence's tokens past its length are written as zero codes). Kernels clamp what
// they read to [0, total_q) / [0, total_kv) and a length to the maximum, so wrong offsets never touch memory outside
// the tensors (the front doors check them where they can).
struct SageSequenceOffsets {
  const int *q;  // cu_seqlens_q, int32 [batch + 1], device memory
  const int *kv; // cu_seqlens_kv, int32 [batch + 1]
  int total_q, total_kv;
};

#define SAGE_NO_CLEARED_WORD 0xffffffffffffffffull

// Quantization prologue: reads Q, K, V once and fills the workspace.
struct SagePrologueParams {
  const void *q, *k, *v; // f16 or bf16, as the kernel was generated for
  struct SageTensorStrides q_strides, k_strides, v_strides;
  struct SageProblemSize size;
  struct SageSequenceOffsets sequences; // packed variants only (all 0 otherwise)
  float q_prescale;                     // multiplies Q before quantization: 1/sqrt(d) * log2(e) when folded, else 1
  unsigned char *workspace;
  struct SageWorkspaceOffsets offsets;
  unsigned long long statistics_offset; // the prologue's own scratch (WorkspaceLayout::prologue_statistics)
  unsigned long long counters_offset;   // the one-pass prologue's counters (WorkspaceLayout::prologue_counters)
  // A 4-byte word of the workspace that thread 0 of CTA 0 zeroes in every launch, or SAGE_NO_CLEARED_WORD: the
  // persistent sm90 kernel's tile counter, cleared by the prologue that precedes it instead of by a memset of its
  // own (one driver call less per call).
  unsigned long long cleared_word_offset;
};

// Attention main loop: reads the workspace (and V directly when it needs no conversion).
struct SageAttentionParams {
  const unsigned char *workspace;
  struct SageWorkspaceOffsets offsets;
  const void *q; // the caller's Q, read by the LSE's K-smoothing correction (q . mean(K)), else unused
  struct SageTensorStrides q_strides;
  const void *v; // the caller's V, used when the variant reads f16 V in place
  struct SageTensorStrides v_strides;
  void *o; // output, same dtype as the input
  struct SageTensorStrides o_strides;
  // Natural-log LSE, or 0: element (b, h, t) at lse[b * lse_strides.batch + h * lse_strides.head + t]; dense
  // [b, h_q, tokens_q]: {h_q tokens_q, tokens_q}; packed [h_q, total_q]: {0, total_q}.
  float *lse;
  struct SageLseStrides lse_strides;
  const unsigned char *block_mask; // [b, h_q, q_blocks, kv_blocks] (1 = compute), or 0
  struct SageProblemSize size;
  float softmax_scale; // 1/sqrt(d): for the LSE and for unfolded variants
  // Causal: query row i sees key j iff j <= i + causal_offset. tokens_kv - tokens_q aligns the mask bottom-right
  // (FlashAttention); 0 aligns it top-left (PyTorch SDPA's is_causal). Unused without a causal mask.
  int causal_offset;
  // Packed variants: t above is the sequence's first row plus its token, and the mask's offset is per sequence:
  // causal_offset + (length_kv - length_q) when causal_bottom_right, else causal_offset (0: top-left).
  struct SageSequenceOffsets sequences;
  int causal_bottom_right;
};

// The sm90 (TMA) kernels: a CUtensorMap per operand, encoded by the runtime with cuTensorMapEncodeTiled for this
// call's workspace and tensors, read by the copy engine straight from the kernel's __grid_constant__ parameters.
// Opaque here (128 bytes, 64-byte aligned, as cuda.h defines CUtensorMap), so this file needs no CUDA header.
struct __attribute__((aligned(64))) SageTensorMap {
  unsigned long long opaque[16];
};

struct SageSm90AttentionParams {
  struct SageTensorMap q_map; // q_codes [b * h_q * padded_q rows][d * bytes]
  struct SageTensorMap k_map; // k_codes [b * h_kv * padded_kv rows][d * bytes]
  struct SageTensorMap v_map; // v_codes [b * h_kv * d rows][padded_kv], v_values, or the caller's V (4-d)
  struct SageAttentionParams base;
  // A persistent kernel's tile counter (WorkspaceLayout::attention_counters), zero when the launch starts; 0 for
  // the others.
  unsigned *tile_counter;
};

#endif // SAGE_KERNEL_ABI_H

// ---- Shapes fixed at generation time, and tunables ----
[[maybe_unused]] constexpr int kThreads = 256;              // threads per CTA (blockDim.x)
[[maybe_unused]] constexpr int kHeadDim = 128;              // d
[[maybe_unused]] constexpr int kVectorElements = 8;         // one 16-byte load holds 8 f16 values
[[maybe_unused]] constexpr int kVectorsPerRow = kHeadDim / kVectorElements;
[[maybe_unused]] constexpr int kLanesPerRow = 16;           // lanes of one token row: kVectorsPerRow rounded up to a power of two
[[maybe_unused]] constexpr int kRowsPerPass = kThreads / kLanesPerRow; // token rows a CTA covers, one vector a thread
[[maybe_unused]] constexpr int kBlockQ = 128;               // b_q: Q tokens per attention tile
[[maybe_unused]] constexpr int kBlockKv = 64;               // b_kv: K/V tokens per attention tile
[[maybe_unused]] constexpr int kStatisticsCtasPerTensor = 128; // column-statistics CTAs per tensor to aim for
[[maybe_unused]] constexpr int kStatisticsMinSliceTokens = 512; // tokens a column-statistics CTA reduces at least
[[maybe_unused]] constexpr int kMaxStatisticsSlices = 32;   // slices per head at most
[[maybe_unused]] constexpr int kStatisticsUnroll = 8;       // loads in flight per thread in a column reduction
[[maybe_unused]] constexpr int kVTileTokens = 128;          // tokens of one V tile
[[maybe_unused]] constexpr int kKBlocksPerTile = 2;         // KV blocks one psi_K CTA quantizes
[[maybe_unused]] constexpr int kKTileTokens = kBlockKv * kKBlocksPerTile;
[[maybe_unused]] constexpr int kVTileWords = kVTileTokens / 4; // a transposed V row packs 4 tokens' codes per word
[[maybe_unused]] constexpr bool kPackedSequences = false; // rows of slot b from cu_seqlens[b]
[[maybe_unused]] constexpr bool kOnePass = false; // statistics and the tiles that wait for them in one launch
[[maybe_unused]] constexpr bool kOnePassKStatistics = false;
[[maybe_unused]] constexpr bool kOnePassVStatistics = false;
[[maybe_unused]] constexpr int kMinCtasPerSm = 3;           // __launch_bounds__' minimum: registers are capped to fit that many CTAs on an SM
[[maybe_unused]] constexpr int kOnePassLookaheadHeads = 1;  // one pass: heads whose statistics run ahead of a head's tiles

// ---- begin sage/device/prologue/geometry.cuh ----
// The quantization prologue's grid geometry: how many CTAs each role has, from the problem size. Mirrored by
// sage::codegen::prologueRoleCtas on the host: change both together. The prologue generator pastes this header after
// KernelAbi.h (SageProblemSize) and its constants (kStatisticsCtasPerTensor, kStatisticsMinSliceTokens,
// kMaxStatisticsSlices, kVTileTokens), whose names it uses.

namespace sage::device::prologue {

__device__ __forceinline__ long long ceilDiv(long long value, long long divisor) {
  return (value + divisor - 1) / divisor;
}
__device__ __forceinline__ long long qHeads(const SageProblemSize &size) {
  return (long long)size.batch * size.heads_q;
}
__device__ __forceinline__ long long kvHeads(const SageProblemSize &size) {
  return (long long)size.batch * size.heads_kv;
}
// Column statistics split each KV head's tokens into slices: enough for kStatisticsCtasPerTensor CTAs over all
// heads, each of at least kStatisticsMinSliceTokens tokens, at most kMaxStatisticsSlices.
__device__ __forceinline__ int statisticsSlices(const SageProblemSize &size) {
  const long long for_parallelism = ceilDiv(kStatisticsCtasPerTensor, kvHeads(size));
  const long long for_length = ceilDiv(size.tokens_kv, kStatisticsMinSliceTokens);
  const long long slices = for_parallelism < for_length ? for_parallelism : for_length;
  return (int)(slices < kMaxStatisticsSlices ? slices : kMaxStatisticsSlices);
}
// Tokens of one slice of a sequence of `length` tokens (a packed slot's own length: its slices share its tokens).
__device__ __forceinline__ int statisticsSliceTokens(int length, int slices) { return (int)ceilDiv(length, slices); }
__device__ __forceinline__ int vTiles(const SageProblemSize &size) {
  return (int)ceilDiv(size.padded_kv, kVTileTokens);
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/geometry.cuh ----
using namespace sage::device::prologue;

// ---- begin sage/device/prologue/scalar_helpers.cuh ----
// The f32 arithmetic of the quantization prologue's quantizers (sage/numerics/Quantizers.h) and the f32 -> f16
// rounding. Needs nothing from the generated code.

namespace sage::device::prologue {

// __fadd_rn, __fsub_rn, __fmul_rn and __fdiv_rn are single IEEE operations, never contracted into an FMA or
// approximated, so codes and scales match the CPU quantizers bit for bit from the same f32 inputs.
struct SymmetricScale {
  float scale;   // dequantize: x ~= code * scale
  float inverse; // quantize:   code = round(x * inverse)
};

// scale = amax / qmax and inverse = qmax / amax, one f32 division each; an all-zero group gets 0 and 0.
__device__ __forceinline__ SymmetricScale symmetricScale(float amax, float code_max) {
  if (amax == 0.0f)
    return {0.0f, 0.0f};
  return {__fdiv_rn(amax, code_max), __fdiv_rn(code_max, amax)};
}

__device__ __forceinline__ float positiveInfinity() { return __int_as_float(0x7f800000); }

// Round to nearest even f16 (a NaN becomes 0x7fff, as sage::numerics::floatToHalfBits).
__device__ __forceinline__ unsigned short floatToHalfBits(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/scalar_helpers.cuh ----

// ---- begin sage/device/prologue/input_f16.cuh ----
// The quantization prologue's inputs when Q, K and V are f16, handled as raw 16-bit values. The generator pastes
// this header or input_bf16.cuh (the same functions), after scalar_helpers.cuh (floatToHalfBits).

namespace sage::device::prologue {

__device__ __forceinline__ float inputToFloat(unsigned bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"((unsigned short)bits));
  return value;
}
// Exact on the values it is used for: minima and maxima of the input itself, and infinities.
__device__ __forceinline__ unsigned short floatToInput(float value) { return floatToHalfBits(value); }
// Round to nearest even f16: the cast that stands in for psi_Q / psi_K when they do not quantize.
__device__ __forceinline__ unsigned short roundToInput(float value) { return floatToHalfBits(value); }

// Element-wise maximum (kMax) or minimum of two f16x2 words; a NaN never wins, as with fmaxf and fminf. Exact:
// the column statistics and the row amax reduce the inputs as they are.
template <bool kMax> __device__ __forceinline__ unsigned extremeOfPairs(unsigned a, unsigned b) {
  unsigned result;
  if constexpr (kMax)
    asm("max.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  else
    asm("min.f16x2 %0, %1, %2;" : "=r"(result) : "r"(a), "r"(b));
  return result;
}
// +inf and -inf in both halves: the identities of the minimum and the maximum.
[[maybe_unused]] constexpr unsigned kPositiveInfinityPair = 0x7c007c00u;
[[maybe_unused]] constexpr unsigned kNegativeInfinityPair = 0xfc00fc00u;

} // namespace sage::device::prologue
// ---- end sage/device/prologue/input_f16.cuh ----

// ---- begin sage/device/prologue/global_memory.cuh ----
// The quantization prologue's global memory: 16-byte vectors of 8 input elements, read through the read-only path,
// and the workspace (sequences.cuh finds the caller's rows). The generator pastes this header after KernelAbi.h and the
// input header (inputToFloat, extremeOfPairs), whose names it uses.

namespace sage::device::prologue {

__device__ __forceinline__ uint4 loadVector(const unsigned short *address) {
  uint4 words;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(words.x), "=r"(words.y), "=r"(words.z), "=r"(words.w)
      : "l"(address));
  return words;
}

// Element j of a vector as f32 (j is a constant once loops are unrolled).
__device__ __forceinline__ float elementOf(const uint4 &words, int j) {
  const unsigned word = j < 2 ? words.x : j < 4 ? words.y : j < 6 ? words.z : words.w;
  return inputToFloat(j % 2 == 0 ? word & 0xffffu : word >> 16);
}

// The largest |element| of a vector, as f32 (exact); a NaN never wins, as with fmaxf. Three pair maxima on the
// magnitudes instead of eight conversions and eight f32 maxima.
__device__ __forceinline__ float maxMagnitudeOf(const uint4 &words) {
  const unsigned low = extremeOfPairs<true>(words.x & 0x7fff7fffu, words.y & 0x7fff7fffu);
  const unsigned high = extremeOfPairs<true>(words.z & 0x7fff7fffu, words.w & 0x7fff7fffu);
  const unsigned both = extremeOfPairs<true>(low, high);
  return fmaxf(fmaxf(0.0f, inputToFloat(both & 0xffffu)), inputToFloat(both >> 16)); // 0 when both are NaN
}

// The word the attention kernel after this prologue needs zeroed (SagePrologueParams::cleared_word_offset): written
// by one thread of CTA 0; the kernel that reads it starts after this launch ends, in stream order.
__device__ __forceinline__ void clearLaunchWord(const SagePrologueParams &params) {
  if (params.cleared_word_offset != SAGE_NO_CLEARED_WORD && blockIdx.x == 0 && threadIdx.x == 0)
    *(unsigned *)(params.workspace + params.cleared_word_offset) = 0u;
}

__device__ __forceinline__ float *workspaceFloats(const SagePrologueParams &params, unsigned long long offset) {
  return (float *)(params.workspace + offset);
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/global_memory.cuh ----

// ---- begin sage/device/prologue/sequences.cuh ----
// Where a batch slot's tokens lie in the caller's Q, K and V, dense or packed (variable-length batches, issue 28).
// Every role reads the caller's rows through `sequenceRows` and takes its number of real tokens from it, so a packed
// slot is written exactly as a dense call of its sequence alone. The prologue generator pastes this header after
// KernelAbi.h, its constants (kPackedSequences) and global_memory.cuh, whose names it uses.

namespace sage::device::prologue {

// The rows of one head of one batch slot: row t of the sequence is at rows + t * token_stride (t < length).
struct SequenceRows {
  const unsigned short *rows;
  long long token_stride;
  int length; // real tokens: the dense tokens_q / tokens_kv, or the packed sequence's length
};

// Sequence `slot` of a packed tensor: cu[slot] .. cu[slot + 1] - 1, both clamped into [0, total] and the length to
// `max_length` (the call's maximum), so that offsets that are wrong give wrong numbers, never a read outside the
// tensor. The host never reads the offsets (CUDA-graph capture). They are read-only for the whole launch (the
// non-coherent path lets the compiler keep or re-read them as registers allow).
__device__ __forceinline__ void packedSequence(const int *offsets, int total, long long slot, int max_length,
                                               long long &first, int &length) {
  const int begin = min(max(__ldg(offsets + slot), 0), total);
  const int end = min(max(__ldg(offsets + slot + 1), 0), total);
  first = begin;
  length = min(max(end - begin, 0), max_length);
}

// Head `head` (= batch slot * heads + head index) of a caller tensor with `tokens` tokens per dense slot. Packed: the
// batch stride is not used (the slot's rows start at cu[slot]); `offsets` / `total` are the tensor's.
__device__ __forceinline__ SequenceRows sequenceRows(const void *tensor, const SageTensorStrides &strides,
                                                     long long head, int heads, [[maybe_unused]] int tokens,
                                                     [[maybe_unused]] const int *offsets, [[maybe_unused]] int total) {
  const long long slot = head / heads;
  long long first = 0;
  int length = tokens;
  long long base = head % heads * strides.head;
  if constexpr (kPackedSequences)
    packedSequence(offsets, total, slot, tokens, first, length);
  else
    base += slot * strides.batch;
  return {(const unsigned short *)tensor + base + first * strides.token, strides.token, length};
}

// The rows of Q head `head` (batch slot * heads_q + head index), of K or V head `head` (batch slot * heads_kv + head
// index).
__device__ __forceinline__ SequenceRows queryRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.q, params.q_strides, head, params.size.heads_q, params.size.tokens_q, params.sequences.q,
                      params.sequences.total_q);
}
__device__ __forceinline__ SequenceRows keyRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.k, params.k_strides, head, params.size.heads_kv, params.size.tokens_kv,
                      params.sequences.kv, params.sequences.total_kv);
}
__device__ __forceinline__ SequenceRows valueRows(const SagePrologueParams &params, long long head) {
  return sequenceRows(params.v, params.v_strides, head, params.size.heads_kv, params.size.tokens_kv,
                      params.sequences.kv, params.sequences.total_kv);
}
// The number of real K/V tokens of KV head `head`'s slot (what the statistics divide by), without a pointer.
__device__ __forceinline__ int keyLength(const SagePrologueParams &params, long long head) {
  return keyRows(params, head).length;
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/sequences.cuh ----

// ---- begin sage/device/prologue/codes.cuh ----
// The quantization prologue's int8 and int4 codes: round, saturate and pack the f32 products x * inverse of one
// 8-channel row vector. Needs nothing from the generated code.

// ---- begin sage/device/conversions.cuh ----
// The scalar PTX atoms every mma family shares (sm80, sm90, hence sm120 and SLA): the special functions ex2/lg2, the
// packing conversions between f32 and the mma operand types (f16, bf16, s8, e4m3), and an input element as f32. One
// copy: the sm80 and sm90 kernels compute the same function with the same instructions.

namespace sage::device {

// 2^x (ex2.approx.ftz: 2 ulp, flushes denormals; 2^-inf = +0)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(x) (lg2.approx.ftz)
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two f32 -> one f16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_f16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// Two f32 -> one bf16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_bf16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}

// One f16x2 register -> two f32 (exact)
__device__ __forceinline__ void unpack_f16x2(unsigned packed, float &low, float &high) {
  asm("{\n"
      "  .reg .f16 low_half, high_half;\n"
      "  mov.b32 {low_half, high_half}, %2;\n"
      "  cvt.f32.f16 %0, low_half;\n"
      "  cvt.f32.f16 %1, high_half;\n"
      "}\n"
      : "=f"(low), "=f"(high)
      : "r"(packed));
}

// Both halves of an f16x2 register times the halves of `factor` (mul.rn.f16x2)
__device__ __forceinline__ unsigned scale_f16x2(unsigned value, unsigned factor) {
  unsigned product;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(product) : "r"(value), "r"(factor));
  return product;
}

// Four f32 -> four saturated int8 codes (round to nearest even) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_s8x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .s32 code0, code1, code2, code3;\n"
      "  .reg .b32 upper;\n"
      "  cvt.rni.s32.f32 code0, %1;\n"
      "  cvt.rni.s32.f32 code1, %2;\n"
      "  cvt.rni.s32.f32 code2, %3;\n"
      "  cvt.rni.s32.f32 code3, %4;\n"
      "  cvt.pack.sat.s8.s32.b32 upper, code3, code2, 0;\n"
      "  cvt.pack.sat.s8.s32.b32 %0, code1, code0, upper;\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

// Four f32 -> four e4m3 codes (round to nearest even, saturate to +-448) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_e4m3x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .b16 low_pair, high_pair;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 low_pair, %2, %1;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 high_pair, %4, %3;\n"
      "  mov.b32 %0, {low_pair, high_pair};\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}

// An f16 or bf16 element of the caller's tensors as f32 (exact)
template <bool kBf16> __device__ __forceinline__ float decode_input_element(unsigned short bits) {
  if constexpr (kBf16) {
    return __uint_as_float(static_cast<unsigned>(bits) << 16); // bf16 is the top half of an f32
  } else {
    float value;
    asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
    return value;
  }
}

} // namespace sage::device
// ---- end sage/device/conversions.cuh ----

namespace sage::device::prologue {

// int8: cvt.rni (round half to even) of the f32 product, saturated to [-127, 127]; a NaN becomes 0.
__device__ __forceinline__ unsigned int8Code(float scaled) {
  int code;
  asm("cvt.rni.sat.s32.f32 %0, %1;" : "=r"(code) : "f"(scaled));
  return (unsigned)(code < -127 ? -127 : code > 127 ? 127 : code) & 0xffu;
}

// int4, stored one per byte (the legalized s4 -> s8 operand): cvt.rni of the f32 product, saturated to [-7, 7]
// (symmetric, as roundToInt4); a NaN becomes 0.
__device__ __forceinline__ unsigned int4Code(float scaled) {
  int code;
  asm("cvt.rni.sat.s32.f32 %0, %1;" : "=r"(code) : "f"(scaled));
  return (unsigned)(code < -7 ? -7 : code > 7 ? 7 : code) & 0xffu;
}

__device__ __forceinline__ uint2 packInt4Codes(const float (&scaled)[8]) {
  uint2 packed = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed.x |= int4Code(scaled[j]) << (8 * j);
    packed.y |= int4Code(scaled[j + 4]) << (8 * j);
  }
  return packed;
}

// Four int8Code codes in one word, `a` in the low byte (the saturation as in packInt8Codes).
__device__ __forceinline__ unsigned int8Codes4(float a, float b, float c, float d) { return pack_s8x4(a, b, c, d); }

// Eight codes of one row vector, channel j in byte j: int8Code's codes, in 12 instructions instead of 36. The
// saturation of pack_s8x4 goes to -128 where int8Code's goes to -127, which never differs here: x * inverse with
// |x| <= amax (over the group, or the channel for V) and
// inverse = fl(127 / amax) stays within 127 * (1 + 2^-23), so it rounds to at most 127 in magnitude.
__device__ __forceinline__ uint2 packInt8Codes(const float (&scaled)[8]) {
  return {pack_s8x4(scaled[0], scaled[1], scaled[2], scaled[3]), pack_s8x4(scaled[4], scaled[5], scaled[6], scaled[7])};
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/codes.cuh ----

// psi_Q: int8 codes, per_token: one scale per token.
[[maybe_unused]] constexpr int QQuantizerGroups = 128;
struct QQuantizer {
  static constexpr int kTileTokens = kBlockQ; // tokens one CTA quantizes
  static constexpr int kGroupsPerTile = QQuantizerGroups; // scales of those tokens
  static constexpr int kGroupsPerBlock = 128; // scales per attention tile
  static constexpr float kCodeMax = 127.0f;
  static __device__ __forceinline__ int groupOfRow(int row) { return row; }
  static __device__ __forceinline__ uint2 pack(const float (&scaled)[8]) { return packInt8Codes(scaled); }
};

// psi_K: int8 codes, per_token: one scale per token.
[[maybe_unused]] constexpr int KQuantizerGroups = 128;
struct KQuantizer {
  static constexpr int kTileTokens = kKTileTokens; // tokens one CTA quantizes
  static constexpr int kGroupsPerTile = KQuantizerGroups; // scales of those tokens
  static constexpr int kGroupsPerBlock = 64; // scales per attention tile
  static constexpr float kCodeMax = 127.0f;
  static __device__ __forceinline__ int groupOfRow(int row) { return row; }
  static __device__ __forceinline__ uint2 pack(const float (&scaled)[8]) { return packInt8Codes(scaled); }
};

// ---- Shared memory of each role, in bytes ----
// A token tile: [kRowsPerPass x kHeadDim partial sums | kHeadDim means | group amax | group inverse].
// A V tile: [kHeadDim means | kHeadDim inverses | kHeadDim x kVTileWords words of codes].
__host__ __device__ constexpr int maxOf(int a, int b) { return a > b ? a : b; }
[[maybe_unused]] constexpr int kMaxGroupsPerTile = maxOf(QQuantizerGroups, KQuantizerGroups);
[[maybe_unused]] constexpr int kTileMeansOffset = kRowsPerPass * kHeadDim * 4;
[[maybe_unused]] constexpr int kTileGroupAmaxOffset = kTileMeansOffset + kHeadDim * 4;
[[maybe_unused]] constexpr int kTileGroupInverseOffset = kTileGroupAmaxOffset + kMaxGroupsPerTile * 4;
[[maybe_unused]] constexpr int kTileSharedBytes = kTileGroupInverseOffset + kMaxGroupsPerTile * 4;
[[maybe_unused]] constexpr int kVQuantizeSharedBytes = 2 * kHeadDim * 4 + kHeadDim * kVTileWords * 4;
// The largest role of this launch:
[[maybe_unused]] constexpr int kSharedBytes =
    maxOf(kTileSharedBytes, kVQuantizeSharedBytes);
static_assert(kThreads % 32 == 0 && kThreads >= kLanesPerRow && kLanesPerRow <= 32, "whole warps, whole rows");

// ---- begin sage/device/prologue/token_tile.cuh ----
// The quantization prologue's token tiles: kTileTokens x kHeadDim inputs spread over the CTA, kept in registers. The
// generator pastes this header after its constants (kHeadDim, kVectorElements, kVectorsPerRow, kLanesPerRow,
// kRowsPerPass) and global_memory.cuh (loadVector, elementOf), whose names it uses.

namespace sage::device::prologue {

// A token row is kLanesPerRow neighbouring lanes of one warp (kVectorsPerRow rounded up to a power of two): lane l of
// the group holds the row's 8-channel vector l. Where d / 8 is not a power of two (d = 80, 96, 160, 192) the group's
// last lanes hold no vector: they load nothing, read channel 0's per-channel values (so that every index stays in
// range), contribute the identity to every row and column reduction, and store nothing.
__device__ __forceinline__ int laneInRow() { return (int)threadIdx.x % kLanesPerRow; }
__device__ __forceinline__ bool laneHoldsVector() {
  return kLanesPerRow == kVectorsPerRow || laneInRow() < kVectorsPerRow;
}
__device__ __forceinline__ int channelOfLane() { return laneHoldsVector() ? laneInRow() * kVectorElements : 0; }

// Thread t holds vector laneInRow() of rows t / kLanesPerRow + pass * kRowsPerPass: the lanes of a row are
// neighbours in one warp, so a row reduces with shuffles.
template <int kTileTokens> struct TokenTile {
  static constexpr int kPasses = (kTileTokens + kRowsPerPass - 1) / kRowsPerPass;
  uint4 raw[kPasses]; // as loaded; zero past the sequence (and in lanes that hold no vector)

  static __device__ __forceinline__ int row(int pass) { return pass * kRowsPerPass + (int)threadIdx.x / kLanesPerRow; }
  static __device__ __forceinline__ int channel() { return channelOfLane(); }
  // This thread holds a vector of a row of the tile: false past the tile and in lanes that hold no vector, which
  // guards every store and every per-row fold.
  static __device__ __forceinline__ bool inTile(int pass) {
    return laneHoldsVector() && (kTileTokens % kRowsPerPass == 0 || row(pass) < kTileTokens);
  }

  // Rows [0, valid_rows) from `first_row`; every load is issued before any is used.
  __device__ __forceinline__ void load(const unsigned short *first_row, long long token_stride, int valid_rows) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      raw[pass] = row(pass) < valid_rows && laneHoldsVector()
                      ? loadVector(first_row + row(pass) * token_stride + channel())
                      : uint4{0u, 0u, 0u, 0u};
  }
  __device__ __forceinline__ float element(int pass, int j) const { return elementOf(raw[pass], j); }
};

} // namespace sage::device::prologue
// ---- end sage/device/prologue/token_tile.cuh ----

// ---- begin sage/device/prologue/tile_reductions.cuh ----
// The quantization prologue's reductions over a row's lanes, over the CTA and over the columns of a token tile. The
// generator pastes this header after its constants (kThreads, kHeadDim, kVectorElements, kVectorsPerRow, kLanesPerRow,
// kRowsPerPass) and token_tile.cuh, whose names it uses. Lanes that hold no vector (token_tile.cuh) count as the
// reductions' identity.

namespace sage::device::prologue {

// combine(value, value of another lane) over the lanes that hold one row; lanes that hold no vector bring 0.
template <class Combine> __device__ __forceinline__ float rowReduce(float value, Combine combine) {
  if (!laneHoldsVector())
    value = 0.0f;
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2)
    value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Max of non-negative values over the lanes that hold one row.
__device__ __forceinline__ float rowMax(float value) {
  return rowReduce(value, [](float a, float b) { return fmaxf(a, b); });
}

// The f32 sum over the lanes that hold one row.
__device__ __forceinline__ float rowSum(float value) {
  return rowReduce(value, [](float a, float b) { return __fadd_rn(a, b); });
}

// Max of non-negative values over the CTA (a NaN never wins, like max.f32). `slot`: one word of shared memory.
__device__ __forceinline__ float ctaMax(float value, unsigned *slot) {
  if (threadIdx.x == 0)
    *slot = 0u;
  __syncthreads();
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0)
    atomicMax(slot, __float_as_uint(value)); // non-negative floats order like their bits
  __syncthreads();
  const float result = __uint_as_float(*slot);
  __syncthreads(); // the slot may be reused right after
  return result;
}

// Folds per-thread partial results of 8 channels over the CTA's kRowsPerPass rows of threads: every thread that holds
// a vector writes its partials to `partials` [kRowsPerPass x kHeadDim], then thread c combines channel c's rows in
// order and hands the result to store(c, value).
template <class Combine, class Store>
__device__ __forceinline__ void foldRows(const float (&mine)[kVectorElements], float *partials, float identity,
                                         Combine combine, Store store) {
  float *slot = partials + (int)threadIdx.x / kLanesPerRow * kHeadDim + channelOfLane();
  if (laneHoldsVector())
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      slot[j] = mine[j];
  __syncthreads();
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    float total = identity;
    for (int row = 0; row < kRowsPerPass; ++row)
      total = combine(total, partials[row * kHeadDim + c]);
    store(c, total);
  }
  __syncthreads();
}

// Per-channel mean of rows [0, valid_rows) of a tile: f32 sums in a fixed order, one f32 division (0 for no rows: a
// Q block past a packed sequence).
template <class Tile, class Values>
__device__ __forceinline__ void tileColumnMeans(const Values &values, int valid_rows, float *partials, float *means) {
  float sum[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    sum[j] = 0.0f;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass)
    if (Tile::row(pass) < valid_rows)
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        sum[j] = __fadd_rn(sum[j], values(pass, j));
  foldRows(
      sum, partials, 0.0f, [](float a, float b) { return __fadd_rn(a, b); },
      [&](int c, float total) { means[c] = valid_rows > 0 ? __fdiv_rn(total, (float)valid_rows) : 0.0f; });
}

// Largest |x| of a whole tile (a per-tensor quantizer's share of the amax).
template <class Tile, class Values> __device__ __forceinline__ float tileAmax(const Values &values, unsigned *slot) {
  float amax = 0.0f;
  if (laneHoldsVector())
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass)
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        amax = fmaxf(amax, fabsf(values(pass, j)));
  return ctaMax(amax, slot);
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/tile_reductions.cuh ----

// ---- begin sage/device/prologue/tile_quantizer.cuh ----
// The quantization prologue's generic tile quantizer psi (int8, int4 and e4m3 codes with one scale per group of
// rows) and the cast that stands in for it. Quantizer is the generated QQuantizer / KQuantizer. The generator pastes
// this header after its constants and shared-memory offsets (kTileGroupAmaxOffset, kTileGroupInverseOffset),
// scalar_helpers.cuh, the input header, token_tile.cuh and tile_reductions.cuh, whose names it uses.

namespace sage::device::prologue {

// Codes of one tile row by row: code = convert(x * inverse), one f32 product per element, to `codes`
// [kTileTokens x kHeadDim]; rows past the sequence hold x = 0 and get code 0; rows from `stored_rows` on lie
// past the padded sequence and are not stored.
template <class Quantizer, class Values, class InverseOfRow>
__device__ __forceinline__ void storeTileCodes(const Values &values, unsigned char *codes, int stored_rows,
                                               InverseOfRow inverse_of_row) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const int row = Tile::row(pass);
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    const float inverse = inverse_of_row(row);
    float scaled[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      scaled[j] = __fmul_rn(values(pass, j), inverse);
    *(uint2 *)(codes + row * kHeadDim + Tile::channel()) = Quantizer::pack(scaled);
  }
}

// The cast of one tile (an unquantized Q or K): every x rounded to the input type, one 16-byte store per thread
// and row, to `values` [kTileTokens x kHeadDim]; rows past the sequence hold x = 0; rows from `stored_rows` on
// lie past the padded sequence and are not stored.
template <class Quantizer, class Values>
__device__ __forceinline__ void storeTileValues(const Values &values, unsigned short *out, int stored_rows) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const int row = Tile::row(pass);
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    unsigned words[4];
#pragma unroll
    for (int pair = 0; pair < 4; ++pair)
      words[pair] = (unsigned)roundToInput(values(pass, 2 * pair)) | (unsigned)roundToInput(values(pass, 2 * pair + 1))
                                                                         << 16;
    *(uint4 *)(out + (long long)row * kHeadDim + Tile::channel()) = uint4{words[0], words[1], words[2], words[3]};
  }
}

// max_j |values(pass, j)|: the Values' own rowVectorAmax where it has one (a faster exact form), else every element.
template <class Values>
__device__ __forceinline__ auto rowVectorAmaxOf(const Values &values, int pass, int)
    -> decltype(values.rowVectorAmax(pass)) {
  return values.rowVectorAmax(pass);
}
template <class Values> __device__ __forceinline__ float rowVectorAmaxOf(const Values &values, int pass, long) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    amax = fmaxf(amax, fabsf(values(pass, j)));
  return amax;
}

// psi on one tile with one scale per group of rows: the amax of every group, scale = amax / qmax and
// inverse = qmax / amax per group (the first `stored_groups` scales to `scales`), then the codes of the first
// `stored_rows` rows. values(pass, j) is the f32 x.
template <class Quantizer, class Values>
__device__ __forceinline__ void quantizeTile(const Values &values, unsigned char *codes, float *scales, int stored_rows,
                                             int stored_groups, unsigned char *shared) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
  unsigned *group_amax = (unsigned *)(shared + kTileGroupAmaxOffset);
  float *group_inverse = (float *)(shared + kTileGroupInverseOffset);
  for (int group = threadIdx.x; group < Quantizer::kGroupsPerTile; group += kThreads)
    group_amax[group] = 0u;
  __syncthreads();
  // 1. amax of each group: a row's lanes reduce with shuffles, then the row's first lane folds the row in.
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const float amax = rowMax(rowVectorAmaxOf(values, pass, 0));
    if (laneInRow() == 0 && Tile::inTile(pass))
      atomicMax(&group_amax[Quantizer::groupOfRow(Tile::row(pass))], __float_as_uint(amax));
  }
  __syncthreads();
  // 2. One f32 scale and inverse per group.
  for (int group = threadIdx.x; group < Quantizer::kGroupsPerTile; group += kThreads) {
    const SymmetricScale scale = symmetricScale(__uint_as_float(group_amax[group]), Quantizer::kCodeMax);
    if (group < stored_groups)
      scales[group] = scale.scale;
    group_inverse[group] = scale.inverse;
  }
  __syncthreads();
  // 3. The codes.
  storeTileCodes<Quantizer>(values, codes, stored_rows,
                            [&](int row) { return group_inverse[Quantizer::groupOfRow(row)]; });
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/tile_quantizer.cuh ----

// ---- begin sage/device/prologue/statistics_scratch.cuh ----
// Launch 1's results for launch 2 of the quantization prologue, in the workspace's prologue_statistics: where each
// lies, and how launch 2 combines a channel's slices. The generator pastes this header after its constants
// (kHeadDim), scalar_helpers.cuh and the input header, whose names it uses, then emits `statisticsScratch(params)`,
// which lays out the fields the variant has.

namespace sage::device::prologue {

// A per-tensor Q's block amax, then column statistics of K and V per (head, slice): at most 16 bytes per channel
// and slice, with slices <= min(64, ceil(tokens_kv / 16)), the bound the workspace is sized for. Minima and
// maxima are stored as input elements, which holds them exactly.
struct StatisticsScratch {
  float *q_amax;                                 // [batch * heads_q][padded_q / kBlockQ]
  float *k_sum, *v_sum;                          // [batch * heads_kv][slices][kHeadDim]
  unsigned short *k_min, *k_max, *v_min, *v_max; // [batch * heads_kv][slices][kHeadDim]
  // The one-pass launch's statistics of each KV head, combined once by its last statistics CTA (one_pass.cuh) for
  // its tiles: mean(K), the per-tensor psi_K's amax (entry 0), mean(V), psi_V's per-channel inverse scales
  // ([batch * heads_kv][kHeadDim] each; the workspace holds one slice more than the slices for them).
  float *k_mean, *k_amax, *v_mean, *v_inverse;
};

// One channel's statistics over the whole sequence, from its entries of launch 1's slices (`first_entry`,
// `first_entry + kHeadDim`, ...) combined in slice order. The mean: the slices' sums added in order, one f32 division;
// 0 for a sequence of no tokens (an empty packed sequence).
// Read through L2 (ld.global.cg): in the one-pass prologue other CTAs wrote them during this launch.
__device__ __forceinline__ float combinedMean(const float *sums, long long first_entry, int slices, int tokens) {
  float sum = 0.0f;
  for (int slice = 0; slice < slices; ++slice)
    sum = __fadd_rn(sum, __ldcg(sums + first_entry + slice * kHeadDim));
  return tokens > 0 ? __fdiv_rn(sum, (float)tokens) : 0.0f;
}

// The amax of x - mean (kCentred: x -> x - mean is monotonic in f32, so the minimum and maximum bound every token),
// or of x. A sequence of no tokens has only the identities (+inf, -inf) in its slices: callers take 0 for it.
template <bool kCentred>
__device__ __forceinline__ float combinedAmax(const unsigned short *minima, const unsigned short *maxima,
                                              long long first_entry, int slices, [[maybe_unused]] float mean) {
  float low = positiveInfinity(), high = -positiveInfinity();
  for (int slice = 0; slice < slices; ++slice) {
    low = fminf(low, inputToFloat(__ldcg(minima + first_entry + slice * kHeadDim)));
    high = fmaxf(high, inputToFloat(__ldcg(maxima + first_entry + slice * kHeadDim)));
  }
  if constexpr (kCentred)
    return fmaxf(fabsf(__fsub_rn(high, mean)), fabsf(__fsub_rn(low, mean)));
  else
    return fmaxf(fabsf(high), fabsf(low));
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/statistics_scratch.cuh ----

__device__ __forceinline__ StatisticsScratch statisticsScratch(const SagePrologueParams &params) {
  const long long entries = kvHeads(params.size) * statisticsSlices(params.size) * kHeadDim;
  unsigned char *cursor = params.workspace + params.statistics_offset;
  StatisticsScratch scratch = {};
  (void)entries;
  scratch.k_sum = (float *)cursor;
  cursor += entries * 4;
  scratch.v_min = (unsigned short *)cursor;
  cursor += entries * 2;
  scratch.v_max = (unsigned short *)cursor;
  cursor += entries * 2;
  scratch.k_mean = (float *)cursor;
  cursor += kvHeads(params.size) * kHeadDim * 4;
  scratch.v_inverse = (float *)cursor;
  cursor += kvHeads(params.size) * kHeadDim * 4;
  return scratch;
}

// ---- begin sage/device/prologue/one_pass.cuh ----
// The one-pass quantization prologue's work order and its waits (PrologueGenerator.h, "One pass"). Every CTA draws
// a ticket; the tickets order the work head by head: the column statistics of KV head h + kOnePassLookaheadHeads,
// a share of the roles that wait for nothing (psi_Q's blocks, ...), then the K and V tiles of head h, which wait
// until head h's statistics CTAs have published. A tile waits only for CTAs with earlier tickets, which were already
// running when it drew its own and never wait themselves, so the launch cannot deadlock whatever the GPU keeps
// resident. The tiles read K and V again, from L2 where the statistics just read them, and the statistics that the
// head's last statistics CTA combined once.
//
// The generator pastes this header after its constants (kOnePassKStatistics, kOnePassVStatistics,
// kOnePassLookaheadHeads, kBlockKv, kKBlocksPerTile) and geometry.cuh, whose names it uses. The counters
// (prologue_counters: the ticket, then one word per KV head) are zero when the launch starts.

namespace sage::device::prologue {

enum class OnePassWork : int { k_statistics, v_statistics, k_tile, v_tile, independent };

struct OnePassItem {
  OnePassWork work;
  long long cta;  // the role function's CTA index (head-major within the role)
  long long head; // batch index * heads_kv + KV head index (statistics and tiles)
};

__device__ __forceinline__ unsigned *onePassCounters(const SagePrologueParams &params) {
  return (unsigned *)(params.workspace + params.counters_offset);
}

// Statistics CTAs of one KV head (K's slices, then V's), and the tiles that wait for them (K's, then V's).
__device__ __forceinline__ int onePassKSlices(const SageProblemSize &size) {
  return kOnePassKStatistics ? statisticsSlices(size) : 0;
}
__device__ __forceinline__ int onePassVSlices(const SageProblemSize &size) {
  return kOnePassVStatistics ? statisticsSlices(size) : 0;
}
__device__ __forceinline__ int onePassKTiles(const SageProblemSize &size) {
  return kOnePassKStatistics ? (int)ceilDiv(size.padded_kv / kBlockKv, kKBlocksPerTile) : 0;
}
__device__ __forceinline__ int onePassVTiles(const SageProblemSize &size) {
  return kOnePassVStatistics ? vTiles(size) : 0;
}

// Item `index` of head `head`'s statistics (index < its slices) or of its tiles.
__device__ __forceinline__ OnePassItem onePassStatisticsItem(const SageProblemSize &size, long long head, int index) {
  const int k_slices = onePassKSlices(size);
  if (index < k_slices)
    return {OnePassWork::k_statistics, head * k_slices + index, head};
  return {OnePassWork::v_statistics, head * onePassVSlices(size) + (index - k_slices), head};
}
__device__ __forceinline__ OnePassItem onePassTileItem(const SageProblemSize &size, long long head, int index) {
  const int k_tiles = onePassKTiles(size);
  if (index < k_tiles)
    return {OnePassWork::k_tile, head * k_tiles + index, head};
  return {OnePassWork::v_tile, head * onePassVTiles(size) + (index - k_tiles), head};
}

// The first ticket of segment `segment` (0 <= segment <= heads): the statistics of heads [0, L) come first; segment h
// holds the statistics of head h + L (while there is one), its share of the independent items, and the tiles of head
// h. Spreading the independent items (psi_Q's blocks, ...) over the segments keeps HBM busy while tiles wait and puts
// more time between a head's statistics and its tiles.
__device__ __forceinline__ long long onePassSegmentStart(long long segment, long long heads, long long lookahead,
                                                         long long statistics, long long tiles, long long independent) {
  const long long with_statistics = segment < heads - lookahead ? segment : heads - lookahead;
  return lookahead * statistics + with_statistics * statistics + segment * independent / heads + segment * tiles;
}

// The work of ticket `ticket` (`cta` of an independent item counts from 0 over those roles, in their order).
__device__ __forceinline__ OnePassItem onePassItem(const SageProblemSize &size, long long ticket,
                                                   long long independent) {
  const long long heads = kvHeads(size);
  const long long statistics = onePassKSlices(size) + onePassVSlices(size); // per head
  const long long tiles = onePassKTiles(size) + onePassVTiles(size);
  const long long lookahead = heads < kOnePassLookaheadHeads ? heads : kOnePassLookaheadHeads;
  if (ticket < lookahead * statistics)
    return onePassStatisticsItem(size, ticket / statistics, (int)(ticket % statistics));
  // The segment: the last whose first ticket is <= ticket.
  long long low = 0, high = heads - 1;
  while (low < high) {
    const long long middle = (low + high + 1) / 2;
    if (onePassSegmentStart(middle, heads, lookahead, statistics, tiles, independent) <= ticket)
      low = middle;
    else
      high = middle - 1;
  }
  const long long segment = low;
  long long offset = ticket - onePassSegmentStart(segment, heads, lookahead, statistics, tiles, independent);
  if (segment + lookahead < heads) {
    if (offset < statistics)
      return onePassStatisticsItem(size, segment + lookahead, (int)offset);
    offset -= statistics;
  }
  const long long first_independent = segment * independent / heads;
  const long long shared = (segment + 1) * independent / heads - first_independent;
  if (offset < shared)
    return {OnePassWork::independent, first_independent + offset, -1};
  return onePassTileItem(size, segment, (int)(offset - shared));
}

// The CTA's ticket, in drawing order (one atomic per CTA), and its work: thread 0 finds it (a search over the
// segments, with 64-bit divisions: a few hundred instructions that every warp would otherwise repeat) and hands it
// to the CTA through shared memory.
__device__ __forceinline__ OnePassItem drawOnePassItem(const SagePrologueParams &params, long long independent) {
  __shared__ OnePassItem item;
  if (threadIdx.x == 0)
    item = onePassItem(params.size, atomicAdd(onePassCounters(params), 1u), independent);
  __syncthreads();
  return item;
}

// After a statistics CTA has written its slice: every thread's stores are made visible to the GPU before the
// head's count goes up (the fence of each writer, then one release by thread 0 after the barrier). The CTA whose
// slice completes the head's count then combines the head's slices once (Roles::combine: in slice order, as every
// tile of the two launches does, so the bytes are theirs) and raises the count once more, to "combined".
template <class Roles>
__device__ __forceinline__ void publishStatistics(const SagePrologueParams &params, long long head,
                                                  unsigned char *shared) {
  const unsigned slices = (unsigned)(onePassKSlices(params.size) + onePassVSlices(params.size));
  unsigned *count = onePassCounters(params) + 1 + head;
  __shared__ unsigned last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(count, 1u) == slices - 1 ? 1u : 0u;
  __syncthreads();
  if (!last)
    return;
  __threadfence(); // the other slices, published before the count this CTA saw, are read after it
  Roles::combine(params, head, shared);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    atomicAdd(count, 1u);
}

// Before a tile reads its head's statistics: until the head's last statistics CTA has combined them. They are then
// read through L2 (ld.global.cg), never a stale L1 line.
__device__ __forceinline__ void awaitStatistics(const SagePrologueParams &params, long long head) {
  if (threadIdx.x == 0) {
    const unsigned combined = (unsigned)(onePassKSlices(params.size) + onePassVSlices(params.size)) + 1u;
    const unsigned *count = onePassCounters(params) + 1 + head;
    unsigned seen;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      if (seen >= combined)
        break;
      __nanosleep(100);
    }
  }
  __syncthreads();
}

// One CTA of the one-pass launch: its ticket, then its work. Roles (generated: the variant's role functions) has
// static kStatistics, vStatistics, kTile, vTile (those the variant has: kOnePassKStatistics, kOnePassVStatistics),
// independent (the roles that wait for nothing, by CTA range) and independentCtas (their CTA count), each taking
// (params, cta, shared), and combine (params, head, shared). Statistics publish when done; the tiles wait in their
// combine (awaitStatistics).
template <class Roles>
__device__ __forceinline__ void runOnePassCta(const SagePrologueParams &params, unsigned char *shared) {
  const OnePassItem item = drawOnePassItem(params, Roles::independentCtas(params));
  switch (item.work) {
  case OnePassWork::k_statistics:
    if constexpr (kOnePassKStatistics) {
      Roles::kStatistics(params, item.cta, shared);
      publishStatistics<Roles>(params, item.head, shared);
    }
    return;
  case OnePassWork::v_statistics:
    if constexpr (kOnePassVStatistics) {
      Roles::vStatistics(params, item.cta, shared);
      publishStatistics<Roles>(params, item.head, shared);
    }
    return;
  case OnePassWork::k_tile:
    if constexpr (kOnePassKStatistics)
      Roles::kTile(params, item.cta, shared);
    return;
  case OnePassWork::v_tile:
    if constexpr (kOnePassVStatistics)
      Roles::vTile(params, item.cta, shared);
    return;
  default:
    return Roles::independent(params, item.cta, shared);
  }
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/one_pass.cuh ----

// ---- begin sage/device/prologue/k_tile.cuh ----
// The K tile of the quantization prologue's psi_K role: kKBlocksPerTile KV blocks of K in registers, and the x that
// psi_K quantizes. The prologue generator pastes this header after its tile library (TokenTile, kKTileTokens,
// kVectorElements), whose names it uses, and names the variant's tile: `using KTile = KTileOf<smoothed K>`.

namespace sage::device::prologue {

// K itself; rows past the sequence are 0.
template <bool kSmoothed> struct KTileOf {
  TokenTile<kKTileTokens> tile;
  __device__ __forceinline__ float operator()(int pass, int j) const { return tile.element(pass, j); }
};

// gamma(K) = K - mean(K), the smoothing of paper 4.2 (one f32 subtraction, mean(K) over the whole sequence, combined
// from launch 1's slices). Rows past the sequence are 0.
template <> struct KTileOf<true> {
  TokenTile<kKTileTokens> tile;
  int valid_rows;              // tokens of this tile inside the sequence
  float mean[kVectorElements]; // mean(K) of this thread's channels

  __device__ __forceinline__ float operator()(int pass, int j) const {
    return TokenTile<kKTileTokens>::row(pass) < valid_rows ? __fsub_rn(tile.element(pass, j), mean[j]) : 0.0f;
  }
};

} // namespace sage::device::prologue
// ---- end sage/device/prologue/k_tile.cuh ----
using KTile = sage::device::prologue::KTileOf<true>; // gamma(K) = K - mean(K)

// ---- begin sage/device/prologue/k_statistics.cuh ----
// The statistics of K over the whole sequence for the quantization prologue's psi_K (launch 2), combined from launch
// 1's slices: mean(K) when K is smoothed, the amax of a per-tensor psi_K (kMinMax). The prologue generator pastes
// this header after its constants, its statistics scratch (statisticsScratch), geometry.cuh, scalar_helpers.cuh, the
// input header, global_memory.cuh, sequences.cuh and tile_reductions.cuh (ctaMax), whose names it uses.

namespace sage::device::prologue {

// Channel by channel (this thread's channels), mean(K) over the head's `tokens` (its slot's sequence; the slices' sums
// in slice order, one f32 division; 0 when K is not smoothed or has no token), handed to emit(c, mean); returns this
// thread's share of the per-tensor psi_K's amax (kMinMax: max |K - mean(K)| or max |K| over its channels; else 0, and
// 0 without a token).
template <bool kSmoothed, bool kMinMax, class Emit>
__device__ __forceinline__ float combineKSlices(const SagePrologueParams &params, long long head, int tokens,
                                                Emit emit) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  float tensor_amax = 0.0f;
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    float mean = 0.0f;
    if constexpr (kSmoothed)
      mean = combinedMean(scratch.k_sum, first_entry, slices, tokens);
    emit(c, mean);
    if constexpr (kMinMax)
      if (tokens > 0)
        tensor_amax =
            fmaxf(tensor_amax, combinedAmax<kSmoothed>(scratch.k_min, scratch.k_max, first_entry, slices, mean));
  }
  return tensor_amax;
}

// mean(K) into shared memory for a K tile, and/or the per-tensor psi_K's amax over the whole sequence (returned; 0
// without one). In the two launches every K tile combines launch 1's slices itself and the first tile of a head
// (`store`) stores k_mean (quantizeKTile the per-tensor scale); in the one-pass launch the head's last statistics CTA
// has combined them once (combineKStatisticsOnce).
template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ float combineKStatistics(const SagePrologueParams &params, long long head,
                                                    [[maybe_unused]] int tokens, [[maybe_unused]] bool store,
                                                    [[maybe_unused]] float *channel_mean,
                                                    [[maybe_unused]] unsigned *amax_slot) {
  if constexpr (kOnePass) {
    awaitStatistics(params, head);
    const StatisticsScratch scratch = statisticsScratch(params);
    if constexpr (kSmoothed)
      for (int c = threadIdx.x; c < kHeadDim; c += kThreads)
        channel_mean[c] = __ldcg(scratch.k_mean + head * kHeadDim + c);
    __syncthreads();
    if constexpr (kMinMax)
      return __ldcg(scratch.k_amax + head * kHeadDim);
    else
      return 0.0f;
  } else {
    const float tensor_amax = combineKSlices<kSmoothed, kMinMax>(params, head, tokens, [&](int c, float mean) {
      if constexpr (kSmoothed) {
        channel_mean[c] = mean;
        if (store)
          workspaceFloats(params, params.offsets.k_mean)[head * kHeadDim + c] = mean;
      }
    });
    if constexpr (kMinMax) {
      return ctaMax(tensor_amax, amax_slot); // its barriers also publish channel_mean
    } else {
      __syncthreads();
      return tensor_amax;
    }
  }
}

// The one-pass launch: head `head`'s K statistics combined once, by its last statistics CTA (one_pass.cuh), into the
// scratch's k_mean / k_amax for the head's tiles, and into k_mean.
template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ void combineKStatisticsOnce(const SagePrologueParams &params, long long head,
                                                       [[maybe_unused]] unsigned *amax_slot) {
  const StatisticsScratch scratch = statisticsScratch(params);
  const float tensor_amax =
      combineKSlices<kSmoothed, kMinMax>(params, head, keyLength(params, head), [&](int c, float mean) {
        if constexpr (kSmoothed) {
          scratch.k_mean[head * kHeadDim + c] = mean;
          workspaceFloats(params, params.offsets.k_mean)[head * kHeadDim + c] = mean;
        }
      });
  if constexpr (kMinMax) {
    const float amax = ctaMax(tensor_amax, amax_slot);
    if (threadIdx.x == 0)
      scratch.k_amax[head * kHeadDim] = amax;
  }
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/k_statistics.cuh ----

// ---- begin sage/device/prologue/k_quantize.cuh ----
// The quantization prologue's psi_K role on kKBlocksPerTile KV blocks of one KV head: k_codes [b, h_kv, padded_kv, d]
// (padded rows 0) and the blocks' k_scales, or the per-tensor scale, FP4 codes and microscales, or K (gamma(K)) rounded
// to the input type when K is not quantized. Role is the variant's KRole (generated: a Config of flags, its K tile and
// its KQuantizer). The prologue generator pastes this header after its constants, sequences.cuh, the tile library,
// k_tile.cuh and the headers of the steps the variant has (k_statistics.cuh, q_mean_correction.cuh, rotation.cuh,
// microscaled_tile.cuh), whose names it uses; the steps a variant lacks are only declared below, and never
// instantiated.

namespace sage::device::prologue {

template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ float combineKStatistics(const SagePrologueParams &params, long long head, int tokens,
                                                    bool store, float *channel_mean, unsigned *amax_slot);
template <class KValues>
__device__ __forceinline__ void writeQMeanCorrection(const KValues &k, const SagePrologueParams &params, long long head,
                                                     int first, int stored_rows);
template <int kTileTokens> struct RotatedTile;
template <int kTileTokens, bool kForK, class Values>
__device__ __forceinline__ RotatedTile<kTileTokens> rotateTile(const Values &values);
template <class Quantizer, class Values>
__device__ __forceinline__ void storeMicroscaledTile(const Values &values, unsigned char *codes, unsigned char *scales,
                                                     int stored_rows);

// The codes of x (K, gamma(K) or its rotation) from row `first` of KV head `head`: with the per-tensor scale of
// `amax` (tile 0 stores it), or with one scale per group of rows (the blocks' k_scales).
template <class Quantizer, bool kPerTensor, class Values>
__device__ __forceinline__ void storeKTileCodes(const Values &x, const SagePrologueParams &params, long long head,
                                                int first, int stored_rows, [[maybe_unused]] float amax,
                                                unsigned char *codes, [[maybe_unused]] unsigned char *shared) {
  if constexpr (kPerTensor) {
    const SymmetricScale scale = symmetricScale(amax, Quantizer::kCodeMax);
    if (first == 0 && threadIdx.x == 0)
      workspaceFloats(params, params.offsets.k_scales)[head] = scale.scale;
    storeTileCodes<Quantizer>(x, codes, stored_rows, [&](int) { return scale.inverse; });
  } else {
    float *scales = workspaceFloats(params, params.offsets.k_scales) + head * params.size.k_scale_count +
                    (long long)(first / kBlockKv) * Quantizer::kGroupsPerBlock;
    quantizeTile<Quantizer>(x, codes, scales, stored_rows, stored_rows / kBlockKv * Quantizer::kGroupsPerBlock, shared);
  }
}

// psi_K (or the cast) of tile `cta` of the role: Role::kStatistics (mean(K) and/or the per-tensor amax of the whole
// sequence, k_statistics.cuh), kSmoothed (gamma(K)), kQMeanCorrection (Q smoothing's delta_s from this tile),
// kRotated (x R_K, after smoothing: the correction above took the unrotated x), kCast, kMicroscaled, kPerTensor.
template <class Role>
__device__ __forceinline__ void quantizeKTileOf(const SagePrologueParams &params, long long cta,
                                                unsigned char *shared) {
  using Quantizer = typename Role::Quantizer;
  const int tiles = (int)ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile);
  const long long head = cta / tiles; // batch index * heads_kv + KV head index
  const int first = (int)(cta % tiles) * kKTileTokens;
  const SequenceRows rows = keyRows(params, head);
  const int valid_rows = min(kKTileTokens, rows.length - first);            // <= 0 past a packed sequence: zero codes
  const int stored_rows = min(kKTileTokens, params.size.padded_kv - first); // whole KV blocks
  typename Role::Tile k;
  k.tile.load(rows.rows + first * rows.token_stride, rows.token_stride, valid_rows);
  [[maybe_unused]] float amax = 0.0f;
  if constexpr (Role::kStatistics) {
    // The statistics of the whole sequence, while this tile's loads are in flight.
    float *channel_mean = (float *)(shared + kTileMeansOffset);
    amax = combineKStatistics<Role::kSmoothed, Role::kPerTensor>(params, head, rows.length, first == 0, channel_mean,
                                                                 (unsigned *)(shared + kTileGroupAmaxOffset));
    if constexpr (Role::kSmoothed) {
      k.valid_rows = valid_rows;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        k.mean[j] = channel_mean[TokenTile<kKTileTokens>::channel() + j];
    }
  }
  if constexpr (Role::kQMeanCorrection)
    writeQMeanCorrection(k, params, head, first, stored_rows);
  if constexpr (Role::kCast) {
    (void)shared;
    unsigned short *values = (unsigned short *)(params.workspace + params.offsets.k_codes) +
                             (head * params.size.padded_kv + first) * kHeadDim;
    storeTileValues<Quantizer>(k, values, stored_rows);
  } else if constexpr (Role::kMicroscaled) {
    // FP4: e2m1 codes [b, h_kv, padded_kv, d / 2], microscales [b, h_kv, padded_kv, d / group]
    unsigned char *codes =
        params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * (kHeadDim / 2);
    unsigned char *scales = params.workspace + params.offsets.k_scales +
                            (head * params.size.padded_kv + first) * (kHeadDim / Quantizer::kGroupChannels);
    storeMicroscaledTile<Quantizer>(k, codes, scales, stored_rows);
  } else {
    unsigned char *codes =
        params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * kHeadDim;
    if constexpr (Role::kRotated)
      storeKTileCodes<Quantizer, Role::kPerTensor>(rotateTile<kKTileTokens, true>(k), params, head, first, stored_rows,
                                                   amax, codes, shared); // x R_K, issue 28
    else
      storeKTileCodes<Quantizer, Role::kPerTensor>(k, params, head, first, stored_rows, amax, codes, shared);
  }
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/k_quantize.cuh ----

// Per-channel psi_V: int8 codes, scale = amax / 127 over all tokens of the channel (paper 4.3).
struct VQuantizer {
  static constexpr float kCodeMax = 127.0f;
  static __device__ __forceinline__ unsigned code(float scaled) { return int8Code(scaled); }
  static __device__ __forceinline__ unsigned codes4(float a, float b, float c, float d) { return int8Codes4(a, b, c, d); }
};

// ---- begin sage/device/prologue/v_codes.cuh ----
// The transposed V tile of the quantization prologue's per-channel psi_V: its shared-memory swizzle. The prologue
// generator pastes this header after its constants (kVectorElements, kVectorsPerRow), whose names it uses.

namespace sage::device::prologue {

// XOR-ing a word index with a multiple of 32 / kVectorsPerRow per 8-channel group keeps both the transposing writes
// and the row reads free of bank conflicts.
__device__ __forceinline__ int vTileSwizzle(int channel) {
  return channel / kVectorElements * (32 / kVectorsPerRow) % 32;
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/v_codes.cuh ----

// ---- begin sage/device/prologue/v_token_order.cuh ----
// v_codes' token axis in the token order of the Hopper wgmma P.V (WorkspaceLayout.h), for the quantization
// prologue's per-channel psi_V: the generator pastes this header only when the variant's v_codes are interleaved.

namespace sage::device::prologue {

// Position p of each 32-token group holds this token, so that an 8-bit A fragment (k = 4q + {0..3}, 16 + 4q +
// {0..3}) matches the S accumulator columns (8j + 2q + {0, 1}) its thread already holds.
__device__ __forceinline__ int vTokenAtPosition(int position) {
  const int p = position % 32;
  return position - p + 16 * (p / 16) + 8 * (p % 4 / 2) + 2 * (p % 16 / 4) + p % 2;
}

// The TokenOrder of quantizeVTileOf (v_quantize.cuh) for these v_codes.
struct WgmmaTokenOrder {
  static __device__ __forceinline__ int token(int position) { return vTokenAtPosition(position); }
};

} // namespace sage::device::prologue
// ---- end sage/device/prologue/v_token_order.cuh ----

// ---- begin sage/device/prologue/v_statistics.cuh ----
// The statistics of V over the whole sequence for the quantization prologue's V roles (launch 2), combined from
// launch 1's slices in slice order: mean(V) when V is smoothed, the per-channel scales of psi_V when V is quantized
// (VQuantizer, the generated psi_V: kCodeMax). The prologue generator pastes this header after its constants, its
// statistics scratch (statisticsScratch), geometry.cuh, scalar_helpers.cuh, the input header, global_memory.cuh and
// sequences.cuh, whose names it uses.

namespace sage::device::prologue {

// Channel by channel (this thread's channels), mean(V) over the head's `tokens` (its slot's sequence; the slices' sums
// in slice order, one f32 division; 0 when V is not smoothed or has no token) and psi_V's scale from the slices'
// minima and maxima (kCodes; scale and inverse 0 without a token, so codes 0), handed to emit(c, mean, scale).
template <bool kSmoothed, bool kCodes, class VQuantizer, class Emit>
__device__ __forceinline__ void combineVSlices(const SagePrologueParams &params, long long head, int tokens,
                                               Emit emit) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    float mean = 0.0f;
    if constexpr (kSmoothed)
      mean = combinedMean(scratch.v_sum, first_entry, slices, tokens);
    SymmetricScale scale = {0.0f, 0.0f};
    if constexpr (kCodes) // max |V - mean(V)| or max |V|
      if (tokens > 0)
        scale = symmetricScale(combinedAmax<kSmoothed>(scratch.v_min, scratch.v_max, first_entry, slices, mean),
                               VQuantizer::kCodeMax);
    emit(c, mean, scale);
  }
}

// mean(V) and/or psi_V's per-channel inverse scales into shared memory for a V tile. In the two launches every V tile
// combines launch 1's slices itself and tile 0 (`store`) stores v_mean and v_scales; in the one-pass launch the
// head's last statistics CTA has combined them once (combineVStatisticsOnce).
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatistics(const SagePrologueParams &params, long long head,
                                                   [[maybe_unused]] int tokens, [[maybe_unused]] bool store,
                                                   [[maybe_unused]] float *channel_mean,
                                                   [[maybe_unused]] float *channel_inverse) {
  if constexpr (kOnePass) {
    awaitStatistics(params, head);
    const StatisticsScratch scratch = statisticsScratch(params);
    for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
      if constexpr (kSmoothed)
        channel_mean[c] = __ldcg(scratch.v_mean + head * kHeadDim + c);
      if constexpr (kCodes)
        channel_inverse[c] = __ldcg(scratch.v_inverse + head * kHeadDim + c);
    }
  } else {
    combineVSlices<kSmoothed, kCodes, VQuantizer>(params, head, tokens, [&](int c, float mean, SymmetricScale scale) {
      if constexpr (kSmoothed) {
        channel_mean[c] = mean;
        if (store)
          workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
      }
      if constexpr (kCodes) {
        channel_inverse[c] = scale.inverse;
        if (store)
          workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
      }
    });
  }
  __syncthreads();
}

// The one-pass launch: head `head`'s V statistics combined once, by its last statistics CTA (one_pass.cuh), into the
// scratch's v_mean / v_inverse for the head's tiles, and into v_mean and v_scales.
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatisticsOnce(const SagePrologueParams &params, long long head) {
  const StatisticsScratch scratch = statisticsScratch(params);
  const int tokens = keyLength(params, head);
  combineVSlices<kSmoothed, kCodes, VQuantizer>(params, head, tokens, [&](int c, float mean, SymmetricScale scale) {
    if constexpr (kSmoothed) {
      scratch.v_mean[head * kHeadDim + c] = mean;
      workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
    }
    if constexpr (kCodes) {
      scratch.v_inverse[head * kHeadDim + c] = scale.inverse;
      workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
    }
  });
}

// mean(V) for convertVTileOf (v_convert.cuh) when V is smoothed.
struct SmoothedVMean {
  static constexpr bool kSmoothed = true;
  static __device__ __forceinline__ void combine(const SagePrologueParams &params, long long head, int tokens,
                                                 bool store, float *channel_mean) {
    combineVStatistics<true, false>(params, head, tokens, store, channel_mean, nullptr);
  }
};

} // namespace sage::device::prologue
// ---- end sage/device/prologue/v_statistics.cuh ----

// ---- begin sage/device/prologue/v_tile.cuh ----
// The V tile that one CTA of a V role of the quantization prologue handles. The prologue generator pastes this header
// after KernelAbi.h, its constants (kVTileTokens), geometry.cuh and sequences.cuh, whose names it uses.

namespace sage::device::prologue {

// V tiles are kVTileTokens tokens of one KV head, head-major over the CTAs of the role.
struct VTileTask {
  long long head;          // batch index * heads_kv + KV head index
  int tile;                // of the head
  int first;               // its first token
  int length;              // the head's tokens (its slot's sequence)
  int valid_rows;          // its tokens inside the sequence (<= 0 in the padding, or past a packed sequence)
  long long token_stride;  // of the caller's V
  const unsigned short *v; // its first token in the caller's V
};

__device__ __forceinline__ VTileTask vTileTask(const SagePrologueParams &params, long long cta) {
  const int tiles = vTiles(params.size);
  VTileTask task;
  task.head = cta / tiles;
  task.tile = (int)(cta % tiles);
  task.first = task.tile * kVTileTokens;
  const SequenceRows rows = valueRows(params, task.head);
  task.length = rows.length;
  task.valid_rows = min(kVTileTokens, rows.length - task.first);
  task.token_stride = rows.token_stride;
  task.v = rows.rows + task.first * task.token_stride;
  return task;
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/v_tile.cuh ----

// ---- begin sage/device/prologue/v_quantize.cuh ----
// The quantization prologue's per-channel psi_V on one V tile (launch 2): codes of V, or of V - mean(V) when
// kSmoothed, transposed to v_codes [b, h_kv, d, padded_kv] for the mma B operand (padded tokens get code 0); tile 0
// also stores v_scales (and v_mean). VQuantizer is the generated psi_V (kCodeMax, code); TokenOrder::token(p) is the
// token at position p of v_codes' token axis (NaturalTokenOrder, or WgmmaTokenOrder of v_token_order.cuh). The
// prologue generator pastes this header after its constants, global_memory.cuh, v_codes.cuh, v_tile.cuh and
// v_statistics.cuh, whose names it uses.

namespace sage::device::prologue {

// v_codes' positions are the tokens.
struct NaturalTokenOrder {
  static __device__ __forceinline__ int token(int position) { return position; }
};

template <bool kSmoothed, class VQuantizer, class TokenOrder>
__device__ __forceinline__ void quantizeVTileOf(const SagePrologueParams &params, long long cta,
                                                unsigned char *shared) {
  const VTileTask v_tile = vTileTask(params, cta);
  float *channel_mean = (float *)shared;
  float *channel_inverse = channel_mean + kHeadDim;
  unsigned *transposed = (unsigned *)(shared + 2 * kHeadDim * 4); // [kHeadDim][kVTileWords], swizzled

  // A task is 4 consecutive positions (tokens, in the natural order) x 8 channels: the 4 codes of one channel pack
  // into one word. The loads are issued first, so that they are in flight while the statistics are combined.
  constexpr int kTasks = kVTileWords * kVectorsPerRow;
  constexpr int kTasksPerThread = (kTasks + kThreads - 1) / kThreads;
  uint4 raw[kTasksPerThread][4];
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int row = TokenOrder::token(4 * word + t);
      raw[i][t] = task < kTasks && row < v_tile.valid_rows ? loadVector(v_tile.v + row * v_tile.token_stride + channel)
                                                           : uint4{0u, 0u, 0u, 0u};
    }
  }
  combineVStatistics<kSmoothed, true, VQuantizer>(params, v_tile.head, v_tile.length, v_tile.tile == 0, channel_mean,
                                                  channel_inverse);
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    if (task >= kTasks)
      break;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j) {
      const float inverse = channel_inverse[channel + j];
      float scaled[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        float x;
        if constexpr (kSmoothed)
          x = TokenOrder::token(4 * word + t) < v_tile.valid_rows
                  ? __fsub_rn(elementOf(raw[i][t], j), channel_mean[channel + j])
                  : 0.0f;
        else
          x = elementOf(raw[i][t], j);
        scaled[t] = __fmul_rn(x, inverse);
      }
      transposed[(channel + j) * kVTileWords + (word ^ vTileSwizzle(channel + j))] =
          VQuantizer::codes4(scaled[0], scaled[1], scaled[2], scaled[3]);
    }
  }
  __syncthreads();

  // 16 bytes (16 tokens of one channel) a thread: the consecutive threads of a channel row write its 128-byte lines.
  // Word w of a row lies at w ^ swizzle: the 4 words of one 16-byte group stay in one group, permuted by the
  // swizzle's two low bits.
  constexpr int kVectorsPerVRow = kVTileWords / 4;
  const int stored_vectors = min(kVTileTokens, params.size.padded_kv - v_tile.first) / 16; // whole KV blocks
  unsigned char *row0 =
      params.workspace + params.offsets.v_codes + v_tile.head * kHeadDim * params.size.padded_kv + v_tile.first;
#pragma unroll
  for (int index = (int)threadIdx.x; index < kHeadDim * kVectorsPerVRow; index += kThreads) {
    const int c = index / kVectorsPerVRow, vector = index % kVectorsPerVRow;
    if (vector >= stored_vectors)
      continue;
    const int swizzle = vTileSwizzle(c);
    uint4 words = *(const uint4 *)&transposed[c * kVTileWords + 4 * (vector ^ (swizzle >> 2))];
    if (swizzle & 2) {
      const unsigned x = words.x, y = words.y;
      words.x = words.z;
      words.y = words.w;
      words.z = x;
      words.w = y;
    }
    if (swizzle & 1) {
      const unsigned x = words.x, z = words.z;
      words.x = words.y;
      words.y = x;
      words.z = words.w;
      words.w = z;
    }
    *(uint4 *)(row0 + (long long)c * params.size.padded_kv + 16 * vector) = words;
  }
}

} // namespace sage::device::prologue
// ---- end sage/device/prologue/v_quantize.cuh ----
struct KRole { // the variant's psi_K role (k_quantize.cuh)
  using Tile = KTile;
  using Quantizer = KQuantizer;
  static constexpr bool kStatistics = true, kSmoothed = true, kQMeanCorrection = false, kRotated = false, kCast = false, kMicroscaled = false, kPerTensor = false;
};

// Launch 2: phi_K = psi_K o gamma on kKBlocksPerTile KV blocks: k_codes [b, h_kv, padded_kv, d] (padded rows 0) and the
// blocks' k_scales.
__device__ __forceinline__ void quantizeKTile(const SagePrologueParams &params, long long cta, unsigned char *shared) {
  quantizeKTileOf<KRole>(params, cta, shared);
}

// Launch 2: per-channel psi_V on one V tile: codes transposed to v_codes [b, h_kv, d, padded_kv]
// for the mma B operand (padded tokens get code 0); tile 0 also stores v_scales.
__device__ __forceinline__ void quantizeVTile(const SagePrologueParams &params, long long cta, unsigned char *shared) {
  quantizeVTileOf<false, VQuantizer, WgmmaTokenOrder>(params, cta, shared);
}

// ---- The launch: each CTA finds its role from blockIdx.x ----
extern "C" __global__ void __launch_bounds__(kThreads, kMinCtasPerSm)
sage_prologue_quantize_after_statistics(const __grid_constant__ SagePrologueParams params) {
  __shared__ __align__(16) unsigned char shared[kSharedBytes];
  long long cta = blockIdx.x;
  clearLaunchWord(params);
  // phi_K = psi_K o gamma per 2 KV block(s) (batch * heads_kv * ceil(tokens_kv / (2 * b_kv)) CTAs)
  const long long k_block_quantize_ctas =
      kvHeads(params.size) * ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile);
  if (cta < k_block_quantize_ctas)
    return quantizeKTile(params, cta, shared);
  cta -= k_block_quantize_ctas;
  // per-channel psi_V per V tile (batch * heads_kv * ceil(padded_kv / 128) CTAs)
  const long long v_tile_quantize_ctas = kvHeads(params.size) * vTiles(params.size);
  if (cta < v_tile_quantize_ctas)
    return quantizeVTile(params, cta, shared);
}
