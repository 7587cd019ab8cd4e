// Steps of O_i^j += P~_i^j V_j: P~ from the S registers into the A fragment of the P.V mma, the mma itself over
// V_j in shared memory, and the flush of a two-level accumulator.
#include "KernelText.h"

#include "sage/codegen/PtxEmitters.h"

#include <stdexcept>
#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;

constexpr std::string_view kPackF16 = R"(// ---- Step: P~_i^j in f16 as the A operand of the P.V mma ----
// The accumulators of two adjacent n8 tiles of S (columns 2t, 2t + 1 of rows g and g + 8) are exactly the A
// fragment of one m16n8k16 over those 16 tokens: P~ never leaves the registers.
__device__ __forceinline__ void pack_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                   const float (&probabilities)[kRowTiles][kScoreTiles][4]) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int step = 0; step < kPvSteps; ++step) {
      const float(&first)[4] = probabilities[row_tile][2 * step];
      const float(&second)[4] = probabilities[row_tile][2 * step + 1];
      p_fragment[row_tile][step][0] = pack_f16x2(first[0], first[1]);   // row g, tokens 2t, 2t + 1
      p_fragment[row_tile][step][1] = pack_f16x2(first[2], first[3]);   // row g + 8
      p_fragment[row_tile][step][2] = pack_f16x2(second[0], second[1]); // row g, tokens 8 + 2t, 9 + 2t
      p_fragment[row_tile][step][3] = pack_f16x2(second[2], second[3]); // row g + 8
    }
}

)";

constexpr std::string_view kPack8Bit =
    R"(// ---- Step: P~_i^j as 8-bit codes (code = round(P~ / P's static scale)) in the A operand of m16n8k32 ----
// With S's interleaved columns (kv_token_of_column), tiles 4s and 4s + 1 hold tokens 4t .. 4t + 3 of the first 16
// tokens of step s, tiles 4s + 2 and 4s + 3 those of the second 16.
__device__ __forceinline__ void pack_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                   const float (&probabilities)[kRowTiles][kScoreTiles][4]) {
  constexpr float c = kProbabilityCodeScale;
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int step = 0; step < kPvSteps; ++step) {
      const float(&t0)[4] = probabilities[row_tile][4 * step];
      const float(&t1)[4] = probabilities[row_tile][4 * step + 1];
      const float(&t2)[4] = probabilities[row_tile][4 * step + 2];
      const float(&t3)[4] = probabilities[row_tile][4 * step + 3];
      p_fragment[row_tile][step][0] = @PACK@(t0[0] * c, t0[1] * c, t1[0] * c, t1[1] * c); // row g
      p_fragment[row_tile][step][1] = @PACK@(t0[2] * c, t0[3] * c, t1[2] * c, t1[3] * c); // row g + 8
      p_fragment[row_tile][step][2] = @PACK@(t2[0] * c, t2[1] * c, t3[0] * c, t3[1] * c); // row g, tokens + 16
      p_fragment[row_tile][step][3] = @PACK@(t2[2] * c, t2[3] * c, t3[2] * c, t3[3] * c); // row g + 8
    }
}

)";

constexpr std::string_view kMultiplyF16 = R"(// ---- Step: O_i^j += P~_i^j V_j ----
// V_j is token-major in shared memory while the B operand wants token pairs of one channel per thread:
// ldmatrix.trans. One x4 gives both k-halves (tokens 0-7, 8-15 of the step) of two n8 channel tiles.
__device__ __forceinline__ void multiply_p_v(@ACCUMULATOR@ (&o_accumulator)[kRowTiles][kOutputTiles][@ACCUMULATOR_REGISTERS@],
                                             const unsigned (&p_fragment)[kRowTiles][kPvSteps][4], unsigned v_tile,
                                             int lane) {
  constexpr int kRowChunks = kVRowBytes / kChunkBytes; // one chunk = 8 f16 channels = one n8 tile
  const int matrix = lane / kLdmatrixRows;
  const unsigned lane_offset =
      swizzled_offset<kRowChunks>((matrix % 2) * kLdmatrixRows + lane % kLdmatrixRows, matrix / 2);
#pragma unroll
  for (int step = 0; step < kPvSteps; ++step)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; tile += 2) {
      unsigned v_fragment[4];
      ldmatrix_x4_trans(v_fragment, tile_address(v_tile, lane_offset, step * kPvStepTokens * kVRowBytes, tile));
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
        @PV_MMA@(o_accumulator[row_tile][tile], p_fragment[row_tile][step], v_fragment[0], v_fragment[1]);
        @PV_MMA@(o_accumulator[row_tile][tile + 1], p_fragment[row_tile][step], v_fragment[2], v_fragment[3]);
      }
    }
}

)";

// V_j^T's B fragments of one n8 channel tile for every k step: one ldmatrix matrix per 16 tokens.
constexpr std::string_view kLoadTransposedValues =
    R"(// V_j^T (channel-major) is the B operand's own layout: plain ldmatrix, one 8x8 matrix per 16 tokens of a channel tile
__device__ __forceinline__ void load_v_fragments(unsigned (&v_fragment)[kPvSteps][2], unsigned v_tile, int tile,
                                                 int lane) {
  constexpr int kRowChunks = kVRowBytes / kChunkBytes; // one chunk = 16 tokens
  const int matrix = lane / kLdmatrixRows;
  const unsigned lane_offset = swizzled_offset<kRowChunks>(lane % kLdmatrixRows, matrix);
  const int row_step = tile * kMmaColumns * kVRowBytes;
#pragma unroll
  for (int pair = 0; pair < kPvSteps / 2; ++pair) {
    unsigned four[4];
    ldmatrix_x4(four, tile_address(v_tile, lane_offset, row_step, pair * 4));
    v_fragment[2 * pair][0] = four[0];
    v_fragment[2 * pair][1] = four[1];
    v_fragment[2 * pair + 1][0] = four[2];
    v_fragment[2 * pair + 1][1] = four[3];
  }
  if (kPvSteps % 2 != 0) {
    constexpr int kLastStep = kPvSteps - 1;
    unsigned two[2];
    ldmatrix_x2(two, tile_address(v_tile, lane_offset, row_step, kLastStep * 2)); // only lanes 0-15 address

    v_fragment[kLastStep][0] = two[0];
    v_fragment[kLastStep][1] = two[1];
  }
}

)";

constexpr std::string_view kMultiplyInt8 = R"(// ---- Step: O_i^j += P~_i^j V_j with int8 codes ----
// The s32 product of the whole block is added into the f32 accumulator; delta_V (per channel) and P's static scale
// are applied once, in the epilogue.
__device__ __forceinline__ void multiply_p_v(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                             const unsigned (&p_fragment)[kRowTiles][kPvSteps][4], unsigned v_tile,
                                             int lane) {
#pragma unroll
  for (int tile = 0; tile < kOutputTiles; ++tile) {
    unsigned v_fragment[kPvSteps][2];
    load_v_fragments(v_fragment, v_tile, tile, lane);
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
      int block_product[4] = {0, 0, 0, 0};
#pragma unroll
      for (int step = 0; step < kPvSteps; ++step)
        @PV_MMA@(block_product, p_fragment[row_tile][step], v_fragment[step][0], v_fragment[step][1]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o_accumulator[row_tile][tile][i] += static_cast<float>(block_product[i]);
    }
  }
}

)";

constexpr std::string_view kMultiplyE4m3 = R"(// ---- Step: O_i^j += P~_i^j V_j with e4m3 codes, accumulated in f32 ----
// delta_V (per channel) and P's static scale are applied once, in the epilogue.
__device__ __forceinline__ void multiply_p_v(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                             const unsigned (&p_fragment)[kRowTiles][kPvSteps][4], unsigned v_tile,
                                             int lane) {
#pragma unroll
  for (int tile = 0; tile < kOutputTiles; ++tile) {
    unsigned v_fragment[kPvSteps][2];
    load_v_fragments(v_fragment, v_tile, tile, lane);
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int step = 0; step < kPvSteps; ++step)
        @PV_MMA@(o_accumulator[row_tile][tile], p_fragment[row_tile][step], v_fragment[step][0], v_fragment[step][1]);
  }
}

)";

constexpr std::string_view kFlushF16 =
    R"(// ---- Step: two-level accumulation: add the f16 accumulator into the f32 one and restart it ----
__device__ __forceinline__ void flush_accumulator(float (&o_flushed)[kRowTiles][kOutputTiles][4],
                                                  unsigned (&o_accumulator)[kRowTiles][kOutputTiles][2]) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float low, high;
        unpack_f16x2(o_accumulator[row_tile][tile][half], low, high);
        o_flushed[row_tile][tile][half * 2] += low;
        o_flushed[row_tile][tile][half * 2 + 1] += high;
        o_accumulator[row_tile][tile][half] = 0u;
      }
}

)";

constexpr std::string_view kFlushF32 =
    R"(// ---- Step: two-level accumulation: add the mma's f32 accumulator into the outer one and restart it ----
__device__ __forceinline__ void flush_accumulator(float (&o_flushed)[kRowTiles][kOutputTiles][4],
                                                  float (&o_accumulator)[kRowTiles][kOutputTiles][4]) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        o_flushed[row_tile][tile][i] += o_accumulator[row_tile][tile][i];
        o_accumulator[row_tile][tile][i] = 0.0f;
      }
}

)";

} // namespace

std::string emitValueSteps(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const std::string pv_mma = mmaFunctionName(plan.pv_mma);
  std::string text;
  switch (plan.pv_path) {
  case PvPath::f16_accumulate_f16:
  case PvPath::f16_accumulate_f32: {
    const bool f16_accumulator = plan.pv_path == PvPath::f16_accumulate_f16;
    text += kPackF16;
    text += substitute(kMultiplyF16, {{"ACCUMULATOR", f16_accumulator ? "unsigned" : "float"},
                                      {"ACCUMULATOR_REGISTERS", f16_accumulator ? "2" : "4"},
                                      {"PV_MMA", pv_mma}});
    if (context.two_level)
      text += f16_accumulator ? kFlushF16 : kFlushF32;
    break;
  }
  case PvPath::int8_per_block:
    text += substitute(kPack8Bit, {{"PACK", "pack_s8x4"}});
    text += kLoadTransposedValues;
    text += substitute(kMultiplyInt8, {{"PV_MMA", pv_mma}});
    break;
  case PvPath::e4m3_accumulate_f32:
    text += substitute(kPack8Bit, {{"PACK", "pack_e4m3x4"}});
    text += kLoadTransposedValues;
    text += substitute(kMultiplyE4m3, {{"PV_MMA", pv_mma}});
    if (context.two_level)
      text += kFlushF32;
    break;
  case PvPath::e2m1_decoded:
    text += emitFp4ValueSteps(context);
    break;
  case PvPath::e2m1_block_scaled:
    throw std::invalid_argument("plan.pv_path: e2m1_block_scaled is the sm120 schedule's, not the sm80 writer's");
  }
  return text;
}

} // namespace sage::codegen::detail
