// What the sm80 (mma.sync) attention kernel derives from its Config: the operand kinds a variant picks, the mma
// fragment geometry of a warp's rows, and the mma wrappers of its two products. The generated Config (see the
// Sm80KernelWriter's output) holds the plan's numbers; everything here is a compile-time function of them.
#pragma once

#include "sage/device/lanes.cuh"
#include "sage/device/sm80/instructions.cuh"
#include "sage/device/sm80/tile_helpers.cuh"

namespace sage::device::sm80 {

// The operands of the Q.K^T mma: int8 codes (int8 and int4 variants: int4 codes are stored one per byte), or the
// 16-bit values of unquantized Q/K (exact) and of FP4 codes decoded by emulation.
enum class QkOperands { int8, f16, bf16 };

// How O_i^j += P~_i^j V_j is computed (schedules::PvPath, the sm80 ones).
enum class PvPath {
  f16_accumulate_f16,  // f16 P~ x f16 V, f16 accumulator (mma m16n8k16 f16.f16.f16.f16)
  f16_accumulate_f32,  // f16 P~ x f16 V, f32 accumulator
  int8_per_block,      // int8 P~ codes x int8 V^T codes, s32 per KV block added into f32 (mma m16n8k32 s8)
  e4m3_accumulate_f32, // e4m3 P~ codes x e4m3 V^T codes, f32 accumulator (mma m16n8k32 e4m3, sm_89+)
  e2m1_decoded,        // FP4 by emulation: P~ microscaled in registers x V^T decoded to 16-bit values, f32 accumulator
};

// Where V_j comes from (schedules::ValueSource).
enum class ValueSource {
  input,            // the caller's f16 V, read in place
  workspace_values, // the workspace's f16 V (converted and/or smoothed by the prologue)
  workspace_codes,  // the workspace's transposed V codes [d, padded_kv] (FP4: e2m1 codes and microscales)
};

template <bool kCondition, class IfTrue, class IfFalse> struct SelectType { using type = IfTrue; };
template <class IfTrue, class IfFalse> struct SelectType<false, IfTrue, IfFalse> { using type = IfFalse; };

// The fragment geometry of one CTA: kWarps warps, each owning kRowsPerWarp consecutive Q rows as m16 row tiles.
// A warp's accumulator tiles are walked with sage::device::for_each_fragment<kRowTiles, kTiles> (lanes.cuh): S over
// the score tiles, O over the output tiles.

// The accumulators of two adjacent n8 tiles of S (columns 2t, 2t + 1 of rows g and g + 8) are exactly the A fragment
// of one m16n8k16 over those 16 tokens: P~ goes into it without leaving the registers, pack(low, high) making each
// 16-bit pair.
template <int kRowTiles, int kPvSteps, int kScoreTiles, class Pack>
__device__ __forceinline__ void pack_score_pairs(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                 const float (&probabilities)[kRowTiles][kScoreTiles][4], Pack pack) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int step = 0; step < kPvSteps; ++step) {
      const float(&first)[4] = probabilities[row_tile][2 * step];
      const float(&second)[4] = probabilities[row_tile][2 * step + 1];
      p_fragment[row_tile][step][0] = pack(first[0], first[1]);   // row g, tokens 2t, 2t + 1
      p_fragment[row_tile][step][1] = pack(first[2], first[3]);   // row g + 8
      p_fragment[row_tile][step][2] = pack(second[0], second[1]); // row g, tokens 8 + 2t, 9 + 2t
      p_fragment[row_tile][step][3] = pack(second[2], second[3]); // row g + 8
    }
}

template <class Config> struct Geometry {
  static constexpr int kThreads = Config::kWarps * kWarpSize;
  static constexpr int kRowsPerWarp = Config::kBlockQ / Config::kWarps;
  static constexpr int kRowTiles = kRowsPerWarp / kMmaRows;           // m16 tiles per warp
  static constexpr int kScoreTiles = Config::kBlockKv / kMmaColumns;  // n8 tiles of S_i^j per row tile
  static constexpr int kOutputTiles = Config::kHeadDim / kMmaColumns; // n8 tiles of O_i per row tile
  static constexpr bool kFp4 = Config::kPv == PvPath::e2m1_decoded;
  static constexpr bool kCodes = Config::kPv == PvPath::int8_per_block || Config::kPv == PvPath::e4m3_accumulate_f32;
  static constexpr bool kF16Accumulator = Config::kPv == PvPath::f16_accumulate_f16;
  // bytes per Q/K element of the Q.K^T mma (FP4: as decoded for the mma, else as in the workspace)
  static constexpr int kQkOperandBytes = Config::kQk == QkOperands::int8 ? 1 : 2;
  static constexpr int kQkRowBytes = Config::kHeadDim * kQkOperandBytes; // a Q/K row in the workspace
  // k32 steps of the Q.K^T mma over a row (int8 at d = 80: the last step's second half reads zero-filled bytes)
  static constexpr int kQkSteps = (kQkRowBytes + kQkStepBytes - 1) / kQkStepBytes;
  static constexpr int kVValueRowBytes = 2 * Config::kHeadDim; // a row of f16 V (the input's or the workspace's)
  // Q_i's fragments are read from its shared tile at every KV block instead of living in registers across the loop
  // where O_i's f32 accumulator leaves too few registers: d > 128 with an f32 accumulator (ptxas, sm_80: sage-vt d192
  // spilled 56 bytes and exact d256 352 bytes with Q in registers). The f16 accumulator (sage-b, sage-t) keeps them.
  static constexpr bool kQFromShared = Config::kHeadDim > 128 && !kF16Accumulator;
  static constexpr int kQFragmentTiles = kQFromShared ? 1 : kRowTiles; // the registers' q_fragment array
  static constexpr int kQFragmentSteps = kQFromShared ? 1 : kQkSteps;
  static constexpr int kPvStepTokens = kCodes ? 32 : 16; // k of the P.V mma
  static constexpr int kPvSteps = Config::kBlockKv / kPvStepTokens;
  static constexpr int kOutputRegisters = kF16Accumulator ? 2 : 4; // per n8 tile: f16x2 words or f32 values

  // S accumulates in s32 (int8 codes; int4 codes one per byte, multiplied as int8) or f32 (16-bit operands)
  using ScoreAccumulator = typename SelectType<Config::kQuantizedQk, int, float>::type;
  // O_i: f16x2 words (rows g, g + 8 x channels 2t, 2t + 1) or f32 values
  using OutputAccumulator = typename SelectType<kF16Accumulator, unsigned, float>::type;
  // S's columns: the block's KV tokens in order, or interleaved for 8-bit P.V (kv_token_of_column)
  using Columns = ScoreColumns<Config::kInterleavedColumns, kPvStepTokens>;

  static_assert(Config::kBlockQ % (Config::kWarps * kMmaRows) == 0, "whole m16 row tiles per warp");
  static_assert(!kFp4 || Config::kQk != QkOperands::int8, "FP4 emulation decodes Q/K to 16-bit values");
};

// The Q.K^T mma of the Config's operands: score += q . k
template <class Config, class Accumulator>
__device__ __forceinline__ void qk_mma(Accumulator (&score)[4], const unsigned (&q)[4], unsigned k0, unsigned k1) {
  if constexpr (Config::kQk == QkOperands::int8)
    mma_m16n8k32_s8_s32(score, q, k0, k1);
  else if constexpr (Config::kQk == QkOperands::f16)
    mma_m16n8k16_f16_f32(score, q, k0, k1);
  else
    mma_m16n8k16_bf16_f32(score, q, k0, k1);
}

// The P.V mma of the Config's path: accumulator += p . v (kRegisters: 2 for the f16 accumulator, else 4)
template <class Config, class Accumulator, int kRegisters>
__device__ __forceinline__ void pv_mma(Accumulator (&accumulator)[kRegisters], const unsigned (&p)[4], unsigned v0,
                                       unsigned v1) {
  if constexpr (Config::kPv == PvPath::f16_accumulate_f16)
    mma_m16n8k16_f16_f16(accumulator, p, v0, v1);
  else if constexpr (Config::kPv == PvPath::f16_accumulate_f32)
    mma_m16n8k16_f16_f32(accumulator, p, v0, v1);
  else if constexpr (Config::kPv == PvPath::int8_per_block)
    mma_m16n8k32_s8_s32(accumulator, p, v0, v1);
  else if constexpr (Config::kPv == PvPath::e4m3_accumulate_f32)
    mma_m16n8k32_e4m3_f32(accumulator, p, v0, v1);
  else if constexpr (Config::kQk == QkOperands::bf16) // FP4 by emulation: the decoded 16-bit type (MXFP4)
    mma_m16n8k16_bf16_f32(accumulator, p, v0, v1);
  else // NVFP4
    mma_m16n8k16_f16_f32(accumulator, p, v0, v1);
}

} // namespace sage::device::sm80
