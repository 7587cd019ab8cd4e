// Steps of O_i^j += P~_i^j V_j of the sm80 (mma.sync) attention kernel with 8-bit P~ codes (PvPath::int8_per_block
// and e4m3_accumulate_f32): P~ / P's static scale packed into the A fragment of m16n8k32, V_j^T's B fragments, and
// the product. The generated kernel includes this header after its constants (kRowTiles, kPvSteps, kVRowBytes,
// kProbabilityCodeScale, ...), its PTX wrappers and its tile helpers, whose names it uses, and names the wrappers
// it emitted for the codes and the mma.
#pragma once

namespace sage::device::sm80 {

// How the P.V product of a KV block reaches the f32 accumulator.
enum class CodeProduct {
  s32_per_block, // int8 codes: the block's product in s32, then added (converted) into the f32 accumulator
  f32,           // e4m3 codes: the mma accumulates in f32 in place
};

// kPackCodes: unsigned(float, float, float, float), four values to four 8-bit codes (pack_s8x4, pack_e4m3x4).
// kPvMma: the kernel's m16n8k32 wrapper, void(int or float (&)[4], const unsigned (&)[4], unsigned, unsigned).
template <CodeProduct kProduct, auto kPackCodes, auto kPvMma> struct CodeValueSteps {
  // ---- Step: P~_i^j as 8-bit codes (code = round(P~ / P's static scale)) in the A operand of m16n8k32 ----
  // With S's interleaved columns (kv_token_of_column), tiles 4s and 4s + 1 hold tokens 4t .. 4t + 3 of the first
  // 16 tokens of step s, tiles 4s + 2 and 4s + 3 those of the second 16.
  static __device__ __forceinline__ void pack_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
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
        p_fragment[row_tile][step][0] = kPackCodes(t0[0] * c, t0[1] * c, t1[0] * c, t1[1] * c); // row g
        p_fragment[row_tile][step][1] = kPackCodes(t0[2] * c, t0[3] * c, t1[2] * c, t1[3] * c); // row g + 8
        p_fragment[row_tile][step][2] = kPackCodes(t2[0] * c, t2[1] * c, t3[0] * c, t3[1] * c); // row g, tokens + 16
        p_fragment[row_tile][step][3] = kPackCodes(t2[2] * c, t2[3] * c, t3[2] * c, t3[3] * c); // row g + 8
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
        if constexpr (kProduct == CodeProduct::s32_per_block) {
          int block_product[4] = {0, 0, 0, 0};
#pragma unroll
          for (int step = 0; step < kPvSteps; ++step)
            kPvMma(block_product, p_fragment[row_tile][step], v_fragment[step][0], v_fragment[step][1]);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            o_accumulator[row_tile][tile][i] += static_cast<float>(block_product[i]);
        } else {
#pragma unroll
          for (int step = 0; step < kPvSteps; ++step)
            kPvMma(o_accumulator[row_tile][tile], p_fragment[row_tile][step], v_fragment[step][0], v_fragment[step][1]);
        }
      }
    }
  }
};

} // namespace sage::device::sm80
