// Steps of O_i^j += P~_i^j V_j of the sm80 (mma.sync) attention kernel with 8-bit P~ codes (PvPath::int8_per_block
// and e4m3_accumulate_f32): P~ / P's static scale packed into the A fragment of m16n8k32, V_j^T's B fragments, and
// the product: int8 codes (PvPath::int8_per_block) add the block's s32 product into the f32 accumulator, e4m3 codes
// (e4m3_accumulate_f32) accumulate in f32 in place.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

template <class Config> struct CodeValueSteps {
  using G = Geometry<Config>;
  static constexpr int kRowTiles = G::kRowTiles, kScoreTiles = G::kScoreTiles, kOutputTiles = G::kOutputTiles;
  static constexpr int kPvSteps = G::kPvSteps, kVRowBytes = Config::kVRowBytes;
  static constexpr bool kS32PerBlock = Config::kPv == PvPath::int8_per_block;
  static_assert(G::kCodes, "8-bit P~ codes");

  // Four values to four 8-bit codes in one register (x0 in bits 0-7)
  static __device__ __forceinline__ unsigned pack_codes(float x0, float x1, float x2, float x3) {
    if constexpr (kS32PerBlock)
      return pack_s8x4(x0, x1, x2, x3);
    else
      return pack_e4m3x4(x0, x1, x2, x3);
  }

  // ---- Step: P~_i^j as 8-bit codes (code = round(P~ / P's static scale)) in the A operand of m16n8k32 ----
  // With S's interleaved columns (kv_token_of_column), tiles 4s and 4s + 1 hold tokens 4t .. 4t + 3 of the first
  // 16 tokens of step s, tiles 4s + 2 and 4s + 3 those of the second 16.
  static __device__ __forceinline__ void pack_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                            const float (&probabilities)[kRowTiles][kScoreTiles][4]) {
    constexpr float c = Config::kProbabilityCodeScale;
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int step = 0; step < kPvSteps; ++step) {
        const float(&t0)[4] = probabilities[row_tile][4 * step];
        const float(&t1)[4] = probabilities[row_tile][4 * step + 1];
        const float(&t2)[4] = probabilities[row_tile][4 * step + 2];
        const float(&t3)[4] = probabilities[row_tile][4 * step + 3];
        p_fragment[row_tile][step][0] = pack_codes(t0[0] * c, t0[1] * c, t1[0] * c, t1[1] * c); // row g
        p_fragment[row_tile][step][1] = pack_codes(t0[2] * c, t0[3] * c, t1[2] * c, t1[3] * c); // row g + 8
        p_fragment[row_tile][step][2] = pack_codes(t2[0] * c, t2[1] * c, t3[0] * c, t3[1] * c); // row g, tokens + 16
        p_fragment[row_tile][step][3] = pack_codes(t2[2] * c, t2[3] * c, t3[2] * c, t3[3] * c); // row g + 8
      }
  }

  // V_j^T (channel-major) is the B operand's own layout: plain ldmatrix, one 8x8 matrix per 16 tokens of a channel
  // tile
  static __device__ __forceinline__ void load_v_fragments(unsigned (&v_fragment)[kPvSteps][2], unsigned v_tile,
                                                          int tile, int lane) {
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

  // ---- Step: O_i^j += P~_i^j V_j with 8-bit codes ----
  // int8: the s32 product of the whole block is added into the f32 accumulator; e4m3: accumulated in f32. delta_V
  // (per channel) and P's static scale are applied once, in the epilogue.
  static __device__ __forceinline__ void multiply_p_v(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                                      const unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                      unsigned v_tile, int lane) {
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile) {
      unsigned v_fragment[kPvSteps][2];
      load_v_fragments(v_fragment, v_tile, tile, lane);
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
        if constexpr (kS32PerBlock) {
          int block_product[4] = {0, 0, 0, 0};
#pragma unroll
          for (int step = 0; step < kPvSteps; ++step)
            pv_mma<Config>(block_product, p_fragment[row_tile][step], v_fragment[step][0], v_fragment[step][1]);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            o_accumulator[row_tile][tile][i] += static_cast<float>(block_product[i]);
        } else {
#pragma unroll
          for (int step = 0; step < kPvSteps; ++step)
            pv_mma<Config>(o_accumulator[row_tile][tile], p_fragment[row_tile][step], v_fragment[step][0],
                           v_fragment[step][1]);
        }
      }
    }
  }
};

} // namespace sage::device::sm80
