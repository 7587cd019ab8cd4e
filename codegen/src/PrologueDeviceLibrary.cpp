// The device library of the generated prologue kernels: constants, conversions, loads, reductions and the
// generic tile quantizer. Everything variant-specific is a constexpr or a small generated struct; the rest is
// fixed text, written once here so that every generated kernel reads the same.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/PrologueDeviceCode.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sage::codegen::prologue {
namespace {

std::string constant(const char *name, long long value, const char *comment) {
  std::string line = "[[maybe_unused]] constexpr int " + std::string(name) + " = " + std::to_string(value) + ";";
  if (*comment)
    line += std::string(line.size() < 60 ? 60 - line.size() : 1, ' ') + "// " + comment;
  return line + "\n";
}

std::string inputName(schedules::InputType input) { return input == schedules::InputType::bf16 ? "bf16" : "f16"; }

// Shared bytes each role needs, as constexpr names defined in emitConstants.
std::string_view sharedBudgetOf(PrologueRole role) {
  switch (role) {
  case PrologueRole::k_column_statistics:
  case PrologueRole::v_column_statistics:
    return "kColumnStatisticsSharedBytes";
  case PrologueRole::q_block_statistics:
  case PrologueRole::q_block_quantize:
  case PrologueRole::k_block_quantize:
    return "kTileSharedBytes";
  case PrologueRole::v_tile_convert:
    return "kVConvertSharedBytes";
  case PrologueRole::v_tile_quantize:
    return "kVQuantizeSharedBytes";
  }
  return "kTileSharedBytes";
}

} // namespace

std::string emitConstants(const PrologueConfig &config) {
  const PrologueTunables &tunables = config.tunables;
  std::string text = "// ---- Shapes fixed at generation time, and tunables ----\n";
  text += constant("kThreads", tunables.threads, "threads per CTA (blockDim.x)");
  text += constant("kHeadDim", config.head_dim, "d");
  text += constant("kVectorElements", 8, ("one 16-byte load holds 8 " + inputName(config.input) + " values").c_str());
  text += "[[maybe_unused]] constexpr int kVectorsPerRow = kHeadDim / kVectorElements;\n";
  text += "[[maybe_unused]] constexpr int kRowsPerPass = kThreads / kVectorsPerRow; // token rows a CTA covers, one "
          "vector a thread\n";
  text += constant("kBlockQ", config.block_q, "b_q: Q tokens per attention tile");
  text += constant("kBlockKv", config.block_kv, "b_kv: K/V tokens per attention tile");
  text += constant("kStatisticsCtasPerTensor", config.statistics_ctas_per_tensor,
                   "column-statistics CTAs per tensor to aim for");
  text += constant("kStatisticsMinSliceTokens", tunables.statistics_min_slice_tokens,
                   "tokens a column-statistics CTA reduces at least");
  text += constant("kMaxStatisticsSlices", tunables.max_statistics_slices, "slices per head at most");
  text += constant("kStatisticsUnroll", tunables.statistics_unroll, "loads in flight per thread in a column reduction");
  text += constant("kVTileTokens", tunables.v_tile_tokens, "tokens of one V tile");
  text += constant("kKBlocksPerTile", tunables.k_blocks_per_tile, "KV blocks one psi_K CTA quantizes");
  text += "[[maybe_unused]] constexpr int kKTileTokens = kBlockKv * kKBlocksPerTile;\n";
  text += "[[maybe_unused]] constexpr int kVTileWords = kVTileTokens / 4; // a transposed V row packs 4 tokens' codes "
          "per word\n";
  return text;
}

std::string emitSharedBudgets(const std::vector<PrologueRole> &roles) {
  std::string text =
      "\n// ---- Shared memory of each role, in bytes ----\n"
      "// A token tile: [kRowsPerPass x kHeadDim partial sums | kHeadDim means | group amax | group inverse].\n"
      "// A V tile: [kHeadDim means | kHeadDim inverses | kHeadDim x kVTileWords words of codes].\n";
  text += "__host__ __device__ constexpr int maxOf(int a, int b) { return a > b ? a : b; }\n";
  text += "[[maybe_unused]] constexpr int kMaxGroupsPerTile = maxOf(QQuantizerGroups, KQuantizerGroups);\n";
  text += "[[maybe_unused]] constexpr int kTileMeansOffset = kRowsPerPass * kHeadDim * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileGroupAmaxOffset = kTileMeansOffset + kHeadDim * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileGroupInverseOffset = kTileGroupAmaxOffset + kMaxGroupsPerTile * 4;\n";
  text += "[[maybe_unused]] constexpr int kTileSharedBytes = kTileGroupInverseOffset + kMaxGroupsPerTile * 4;\n";
  const auto uses = [&](const char *budget) {
    return std::any_of(roles.begin(), roles.end(), [&](PrologueRole role) { return sharedBudgetOf(role) == budget; });
  };
  if (uses("kColumnStatisticsSharedBytes"))
    text += "[[maybe_unused]] constexpr int kColumnStatisticsSharedBytes = kRowsPerPass * kHeadDim * 4;\n";
  if (uses("kVConvertSharedBytes"))
    text += "[[maybe_unused]] constexpr int kVConvertSharedBytes = kHeadDim * 4;\n";
  if (uses("kVQuantizeSharedBytes"))
    text += "[[maybe_unused]] constexpr int kVQuantizeSharedBytes = 2 * kHeadDim * 4 + kHeadDim * kVTileWords * 4;\n";
  std::vector<std::string> budgets;
  for (PrologueRole role : roles)
    if (std::find(budgets.begin(), budgets.end(), sharedBudgetOf(role)) == budgets.end())
      budgets.emplace_back(sharedBudgetOf(role));
  std::string largest = budgets.front();
  for (size_t i = 1; i < budgets.size(); ++i)
    largest = "maxOf(" + largest + ", " + budgets[i] + ")";
  text += "// The largest role of this launch:\n";
  text += "[[maybe_unused]] constexpr int kSharedBytes =\n    " + largest + ";\n";
  text += "static_assert(kThreads % 32 == 0 && kThreads >= kVectorsPerRow, \"whole warps, whole rows\");\n";
  return text;
}

std::string emitBasicHelpers(const PrologueConfig &config) {
  std::string text = R"cuda(
// ---- Geometry, mirrored by sage::codegen::prologueRoleCtas on the host: change both together ----
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
__device__ __forceinline__ int statisticsSliceTokens(const SageProblemSize &size) {
  return (int)ceilDiv(size.tokens_kv, statisticsSlices(size));
}
__device__ __forceinline__ int vTiles(const SageProblemSize &size) {
  return (int)ceilDiv(size.padded_kv, kVTileTokens);
}

// ---- f32 arithmetic of the quantizers (sage/numerics/Quantizers.h) ----
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
)cuda";
  if (config.input == schedules::InputType::bf16)
    text += R"cuda(
// ---- Inputs: bf16, handled as raw 16-bit values ----
__device__ __forceinline__ float inputToFloat(unsigned bits) { return __uint_as_float(bits << 16); }
// Exact on the values it is used for: minima and maxima of the input itself, and infinities.
__device__ __forceinline__ unsigned short floatToInput(float value) {
  return (unsigned short)(__float_as_uint(value) >> 16);
}
// Round to nearest even bf16: the cast that stands in for psi_Q / psi_K when they do not quantize.
__device__ __forceinline__ unsigned short roundToInput(float value) {
  unsigned short bits;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}
)cuda";
  else
    text += R"cuda(
// ---- Inputs: f16, handled as raw 16-bit values ----
__device__ __forceinline__ float inputToFloat(unsigned bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"((unsigned short)bits));
  return value;
}
// Exact on the values it is used for: minima and maxima of the input itself, and infinities.
__device__ __forceinline__ unsigned short floatToInput(float value) { return floatToHalfBits(value); }
// Round to nearest even f16: the cast that stands in for psi_Q / psi_K when they do not quantize.
__device__ __forceinline__ unsigned short roundToInput(float value) { return floatToHalfBits(value); }
)cuda";
  text += R"cuda(
// ---- Global memory: 16-byte vectors of 8 input elements, read through the read-only path ----
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

// Head `head` (= batch index * heads + head index) of a caller tensor.
__device__ __forceinline__ const unsigned short *headPointer(const void *tensor,
                                                             const SageTensorStrides &strides,
                                                             long long head, int heads) {
  return (const unsigned short *)tensor + head / heads * strides.batch + head % heads * strides.head;
}

__device__ __forceinline__ float *workspaceFloats(const SagePrologueParams &params,
                                                  unsigned long long offset) {
  return (float *)(params.workspace + offset);
}
)cuda";
  return text;
}

std::string emitE4m3SoftwareEncoder() {
  return R"cuda(
// cvt.rn.satfinite.e4m3 in integer arithmetic, for GPUs without the instruction (sm_80, sm_86): round half
// to even, clamp to +-448 (infinities included), NaN -> 0x7f, zero keeps its sign.
__device__ __forceinline__ unsigned encodeE4m3Software(float value) {
  const unsigned bits = __float_as_uint(value);
  const unsigned sign = (bits >> 24) & 0x80u;
  const unsigned magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u)
    return 0x7fu; // NaN
  if (magnitude >= 0x43e00000u)
    return sign | 0x7eu; // >= 448: every such value rounds to 448 or saturates to it
  if (magnitude < 0x3c800000u) {
    // Below 2^-6, E4M3 steps by 2^-9: scale exactly by 2^9 and round half to even (8 is the smallest normal).
    int steps;
    asm("cvt.rni.s32.f32 %0, %1;" : "=r"(steps) : "f"(__fmul_rn(__uint_as_float(magnitude), 512.0f)));
    return sign | (unsigned)steps;
  }
  // Normal: keep 3 mantissa bits with round half to even on the f32 bits, then rebias the exponent 127 -> 7.
  const unsigned rounded = (magnitude + 0x7ffffu + ((magnitude >> 20) & 1u)) >> 20;
  return sign | (rounded - (120u << 3));
}
)cuda";
}

namespace {

// The device library's FP4 microscaling (sage/device/fp4/microscaling.cuh, host-tested against sage::numerics),
// pasted in: the prologue is one self-contained translation unit.
std::string fp4Helpers() {
  const DeviceHeader *header = findDeviceHeader("sage/device/fp4/microscaling.cuh");
  if (header == nullptr)
    throw std::logic_error("prologue generator: the device library lacks sage/device/fp4/microscaling.cuh");
  std::string text(header->text);
  const size_t pragma = text.find("#pragma once\n");
  if (pragma != std::string::npos)
    text.erase(pragma, 13);
  return "\n// ---- FP4 microscaling (from the device library) ----\n" + text;
}

} // namespace

std::string emitCodeHelpers(const PrologueConfig &config) {
  std::string text = R"cuda(
// ---- Codes ----
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

// Eight codes of one row vector, channel j in byte j.
__device__ __forceinline__ uint2 packInt8Codes(const float (&scaled)[8]) {
  uint2 packed = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    packed.x |= int8Code(scaled[j]) << (8 * j);
    packed.y |= int8Code(scaled[j + 4]) << (8 * j);
  }
  return packed;
}
)cuda";
  if (config.usesFp4())
    text += fp4Helpers();
  if (config.usesE4m3()) {
    text += emitE4m3SoftwareEncoder();
    text += R"cuda(
// e4m3: cvt.rn.satfinite (round half to even, clamp to +-448, NaN -> 0x7f) of two f32 products; low in the
// low byte.
__device__ __forceinline__ unsigned e4m3CodePair(float low, float high) {
#if __CUDA_ARCH__ >= 890
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(high), "f"(low));
  return pair;
#else
  return encodeE4m3Software(low) | encodeE4m3Software(high) << 8;
#endif
}

__device__ __forceinline__ unsigned e4m3Code(float scaled) { return e4m3CodePair(scaled, 0.0f) & 0xffu; }

__device__ __forceinline__ uint2 packE4m3Codes(const float (&scaled)[8]) {
  return {e4m3CodePair(scaled[0], scaled[1]) | e4m3CodePair(scaled[2], scaled[3]) << 16,
          e4m3CodePair(scaled[4], scaled[5]) | e4m3CodePair(scaled[6], scaled[7]) << 16};
}
)cuda";
  }
  return text;
}

std::string emitTileLibrary() {
  return R"cuda(
// ---- Token tiles: kTileTokens x kHeadDim inputs spread over the CTA, kept in registers ----
// Thread t holds the 8-channel vector t % kVectorsPerRow of rows t / kVectorsPerRow + pass * kRowsPerPass: the
// kVectorsPerRow lanes of a row are neighbours in one warp, so a row reduces with shuffles.
template <int kTileTokens> struct TokenTile {
  static constexpr int kPasses = (kTileTokens + kRowsPerPass - 1) / kRowsPerPass;
  uint4 raw[kPasses]; // as loaded; zero past the sequence

  static __device__ __forceinline__ int row(int pass) {
    return pass * kRowsPerPass + (int)threadIdx.x / kVectorsPerRow;
  }
  static __device__ __forceinline__ int channel() { return (int)threadIdx.x % kVectorsPerRow * kVectorElements; }
  static __device__ __forceinline__ bool inTile(int pass) {
    return kTileTokens % kRowsPerPass == 0 || row(pass) < kTileTokens;
  }

  // Rows [0, valid_rows) from `first_row`; every load is issued before any is used.
  __device__ __forceinline__ void load(const unsigned short *first_row, long long token_stride, int valid_rows) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      raw[pass] = row(pass) < valid_rows ? loadVector(first_row + row(pass) * token_stride + channel())
                                         : uint4{0u, 0u, 0u, 0u};
  }
  __device__ __forceinline__ float element(int pass, int j) const { return elementOf(raw[pass], j); }
};

// Max over the kVectorsPerRow lanes that hold one row.
__device__ __forceinline__ float rowMax(float value) {
#pragma unroll
  for (int offset = kVectorsPerRow / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
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

// Folds per-thread partial results of 8 channels over the CTA's kRowsPerPass rows of threads: every thread
// writes its partials to `partials` [kRowsPerPass x kHeadDim], then thread c combines channel c's rows in
// order and hands the result to store(c, value).
template <class Combine, class Store>
__device__ __forceinline__ void foldRows(const float (&mine)[kVectorElements], float *partials,
                                         float identity, Combine combine, Store store) {
  float *slot = partials + (int)threadIdx.x / kVectorsPerRow * kHeadDim +
                (int)threadIdx.x % kVectorsPerRow * kVectorElements;
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

// Per-channel mean of rows [0, valid_rows) of a tile: f32 sums in a fixed order, one f32 division.
template <class Tile, class Values>
__device__ __forceinline__ void tileColumnMeans(const Values &values, int valid_rows, float *partials,
                                                float *means) {
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
      [&](int c, float total) { means[c] = __fdiv_rn(total, (float)valid_rows); });
}

// Largest |x| of a whole tile (a per-tensor quantizer's share of the amax).
template <class Tile, class Values>
__device__ __forceinline__ float tileAmax(const Values &values, unsigned *slot) {
  float amax = 0.0f;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass)
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      amax = fmaxf(amax, fabsf(values(pass, j)));
  return ctaMax(amax, slot);
}

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
      words[pair] = (unsigned)roundToInput(values(pass, 2 * pair)) |
                    (unsigned)roundToInput(values(pass, 2 * pair + 1)) << 16;
    *(uint4 *)(out + (long long)row * kHeadDim + Tile::channel()) = uint4{words[0], words[1], words[2], words[3]};
  }
}

// psi on one tile with one scale per group of rows: the amax of every group, scale = amax / qmax and
// inverse = qmax / amax per group (the first `stored_groups` scales to `scales`), then the codes of the first
// `stored_rows` rows. values(pass, j) is the f32 x.
template <class Quantizer, class Values>
__device__ __forceinline__ void quantizeTile(const Values &values, unsigned char *codes, float *scales,
                                             int stored_rows, int stored_groups, unsigned char *shared) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
  unsigned *group_amax = (unsigned *)(shared + kTileGroupAmaxOffset);
  float *group_inverse = (float *)(shared + kTileGroupInverseOffset);
  for (int group = threadIdx.x; group < Quantizer::kGroupsPerTile; group += kThreads)
    group_amax[group] = 0u;
  __syncthreads();
  // 1. amax of each group: a row's lanes reduce with shuffles, then the row's first lane folds the row in.
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      amax = fmaxf(amax, fabsf(values(pass, j)));
    amax = rowMax(amax);
    if (threadIdx.x % kVectorsPerRow == 0 && Tile::inTile(pass))
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
)cuda";
}

std::string emitTokenQuantizer(const char *name, const TokenQuantizerConfig &quantizer, const char *tile_constant,
                               int blocks_per_tile, const char *what) {
  if (quantizer.microscaled()) {
    const bool mx = quantizer.groupChannels() == 32;
    std::string text = "\n// " + std::string(what) + ": " +
                       (mx ? "MXFP4: e2m1 codes, one ue8m0 scale per 32 channels of a token"
                           : "NVFP4: e2m1 codes, one ue4m3 scale per 16 channels of a token") +
                       "; codes [tokens, d / 2] (channel 2k in the\n// low nibble of byte k), scales [tokens, d / " +
                       std::to_string(quantizer.groupChannels()) + "], one byte each.\n";
    text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = 0;\n";
    text += "struct " + std::string(name) + " {\n";
    text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA quantizes\n";
    text += "  static constexpr int kGroupChannels = " + std::to_string(quantizer.groupChannels()) + ";\n";
    text += "  static __device__ __forceinline__ unsigned scaleCode(float amax) { return sage::device::fp4::" +
            std::string(mx ? "mxfp4_scale_code" : "nvfp4_scale_code") + "(amax); }\n";
    text += "  static __device__ __forceinline__ float inverse(unsigned scale) { return sage::device::fp4::" +
            std::string(mx ? "mxfp4_inverse" : "nvfp4_inverse") + "(scale); }\n";
    text += "};\n";
    (void)blocks_per_tile;
    return text;
  }
  if (quantizer.cast()) {
    std::string text = "\n// " + std::string(what) + ": none (the operand is not quantized): values rounded to " +
                       std::string(nameOf(quantizer.dtype)) + ", 2 bytes each, no scales.\n";
    text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = 0;\n";
    text += "struct " + std::string(name) + " {\n";
    text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA casts\n";
    text += "  static constexpr int kGroupsPerTile = 0;\n";
    text += "  static constexpr int kGroupsPerBlock = 0;\n";
    text += "};\n";
    return text;
  }
  const bool e4m3 = quantizer.dtype == ElementType::e4m3;
  const bool int4 = quantizer.dtype == ElementType::int4;
  std::string granularity;
  std::string group_of_row;
  switch (quantizer.granularity) {
  case Granularity::per_tensor:
    granularity = "per_tensor: one scale for the whole sequence of a head";
    group_of_row = "0";
    break;
  case Granularity::per_token:
    granularity = "per_token: one scale per token";
    group_of_row = "row";
    break;
  case Granularity::per_block:
  case Granularity::per_warp:
    granularity = std::string(quantizer.granularity == Granularity::per_block ? "per_block" : "per_warp") +
                  ": one scale per " + std::to_string(quantizer.group_tokens) + " consecutive tokens";
    group_of_row = "row / " + std::to_string(quantizer.group_tokens);
    break;
  default: // per_thread
    granularity = "per_thread: tokens t, t + 8, t + 16, ... of each " + std::to_string(quantizer.group_tokens) +
                  "-token group share a scale\n// (the rows of one mma thread group)";
    group_of_row = "row / " + std::to_string(quantizer.group_tokens) + " * 8 + row % 8";
    break;
  }
  std::string text = "\n// " + std::string(what) + ": " +
                     (e4m3   ? "e4m3"
                      : int4 ? "int4 (one per byte, [-7, 7])"
                             : "int8") +
                     " codes, " + granularity + ".\n";
  const int groups = quantizer.perTensor() ? 1 : quantizer.groups_per_tile * blocks_per_tile;
  text += "[[maybe_unused]] constexpr int " + std::string(name) + "Groups = " + std::to_string(groups) + ";\n";
  text += "struct " + std::string(name) + " {\n";
  text += "  static constexpr int kTileTokens = " + std::string(tile_constant) + "; // tokens one CTA quantizes\n";
  text += "  static constexpr int kGroupsPerTile = " + std::string(name) + "Groups; // scales of those tokens\n";
  text += "  static constexpr int kGroupsPerBlock = " +
          std::to_string(quantizer.perTensor() ? 1 : quantizer.groups_per_tile) + "; // scales per attention tile\n";
  text += std::string("  static constexpr float kCodeMax = ") + (e4m3 ? "448.0f" : int4 ? "7.0f" : "127.0f") + ";\n";
  text += "  static __device__ __forceinline__ int groupOfRow(int row) { return " + group_of_row + "; }\n";
  text += std::string("  static __device__ __forceinline__ uint2 pack(const float (&scaled)[8]) { return ") +
          (e4m3   ? "packE4m3Codes"
           : int4 ? "packInt4Codes"
                  : "packInt8Codes") +
          "(scaled); }\n";
  text += "};\n";
  return text;
}

std::string emitStatisticsScratch(const PrologueConfig &config, bool with_reduction) {
  std::string text = R"cuda(
// ---- Launch 1's results for launch 2, in the workspace's prologue_statistics ----
// A per-tensor Q's block amax, then column statistics of K and V per (head, slice): at most 16 bytes per channel
// and slice, with slices <= min(64, ceil(tokens_kv / 16)), the bound the workspace is sized for. Minima and
// maxima are stored as input elements, which holds them exactly.
struct StatisticsScratch {
  float *q_amax;                                 // [batch * heads_q][padded_q / kBlockQ]
  float *k_sum, *v_sum;                          // [batch * heads_kv][slices][kHeadDim]
  unsigned short *k_min, *k_max, *v_min, *v_max; // [batch * heads_kv][slices][kHeadDim]
};

__device__ __forceinline__ StatisticsScratch statisticsScratch(const SagePrologueParams &params) {
  const long long entries = kvHeads(params.size) * statisticsSlices(params.size) * kHeadDim;
  unsigned char *cursor = params.workspace + params.statistics_offset;
  StatisticsScratch scratch = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  (void)entries;
)cuda";
  if (config.q.perTensor()) {
    text += "  scratch.q_amax = (float *)cursor;\n";
    text += "  cursor += qHeads(params.size) * (params.size.padded_q / kBlockQ) * 4;\n";
  }
  const auto take = [&](const char *field, const char *type, int bytes) {
    text += "  scratch." + std::string(field) + " = (" + type + " *)cursor;\n";
    text += "  cursor += entries * " + std::to_string(bytes) + ";\n";
  };
  if (config.smooth_k)
    take("k_sum", "float", 4);
  if (config.smooth_v)
    take("v_sum", "float", 4);
  if (config.kMinMax()) {
    take("k_min", "unsigned short", 2);
    take("k_max", "unsigned short", 2);
  }
  if (config.vMinMax()) {
    take("v_min", "unsigned short", 2);
    take("v_max", "unsigned short", 2);
  }
  text += "  return scratch;\n}\n";
  if (!with_reduction)
    return text;
  text += R"cuda(
// Per-channel sum and/or min and max of rows [begin, end) of one head. Each thread reduces every
// kRowsPerPass-th row of its 8 channels with kStatisticsUnroll loads in flight; then thread c folds the
// kRowsPerPass partial results of channel c in order into this slice's entries.
template <bool kSum, bool kMinMax>
__device__ __forceinline__ void reduceColumns(const unsigned short *head, long long token_stride, int begin,
                                              int end, float *partials, float *sum_out,
                                              unsigned short *min_out, unsigned short *max_out) {
  const int channel = (int)threadIdx.x % kVectorsPerRow * kVectorElements;
  float sum[kVectorElements], low[kVectorElements], high[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j) {
    sum[j] = 0.0f;
    low[j] = positiveInfinity();
    high[j] = -positiveInfinity();
  }
  for (int row = begin + (int)threadIdx.x / kVectorsPerRow; row < end; row += kRowsPerPass * kStatisticsUnroll) {
    uint4 raw[kStatisticsUnroll];
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u) {
      const int r = row + u * kRowsPerPass;
      raw[u] = r < end ? loadVector(head + r * token_stride + channel) : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u)
      if (row + u * kRowsPerPass < end)
#pragma unroll
        for (int j = 0; j < kVectorElements; ++j) {
          const float value = elementOf(raw[u], j);
          if constexpr (kSum)
            sum[j] = __fadd_rn(sum[j], value);
          if constexpr (kMinMax) {
            low[j] = fminf(low[j], value);
            high[j] = fmaxf(high[j], value);
          }
        }
  }
  if constexpr (kSum)
    foldRows(
        sum, partials, 0.0f, [](float a, float b) { return __fadd_rn(a, b); },
        [&](int c, float total) { sum_out[c] = total; });
  if constexpr (kMinMax) {
    foldRows(low, partials, positiveInfinity(), [](float a, float b) { return fminf(a, b); },
             [&](int c, float lowest) { min_out[c] = floatToInput(lowest); });
    foldRows(high, partials, -positiveInfinity(), [](float a, float b) { return fmaxf(a, b); },
             [&](int c, float highest) { max_out[c] = floatToInput(highest); });
  }
}
)cuda";
  return text;
}

} // namespace sage::codegen::prologue
