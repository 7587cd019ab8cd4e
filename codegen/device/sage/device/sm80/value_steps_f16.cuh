// Steps of O_i^j += P~_i^j V_j of the sm80 (mma.sync) attention kernel with f16 P~ (PvPath::f16_accumulate_f16 and
// f16_accumulate_f32): P~ from the S registers into the A fragment of the P.V mma, and the mma itself over V_j in
// shared memory (f16 x f16 with an f16 or f32 accumulator: pv_mma<Config>).
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

template <class Config> struct F16ValueSteps {
  using G = Geometry<Config>;
  static constexpr int kRowTiles = G::kRowTiles, kScoreTiles = G::kScoreTiles, kOutputTiles = G::kOutputTiles;
  static constexpr int kPvSteps = G::kPvSteps, kPvStepTokens = G::kPvStepTokens, kVRowBytes = Config::kVRowBytes;

  // ---- Step: P~_i^j in f16 as the A operand of the P.V mma ----
  // The accumulators of two adjacent n8 tiles of S (columns 2t, 2t + 1 of rows g and g + 8) are exactly the A
  // fragment of one m16n8k16 over those 16 tokens: P~ never leaves the registers.
  static __device__ __forceinline__ void pack_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                            const float (&probabilities)[kRowTiles][kScoreTiles][4]) {
    pack_score_pairs(p_fragment, probabilities, [](float low, float high) { return pack_f16x2(low, high); });
  }

  // ---- Step: O_i^j += P~_i^j V_j ----
  // V_j is token-major in shared memory while the B operand wants token pairs of one channel per thread:
  // ldmatrix.trans. One x4 gives both k-halves (tokens 0-7, 8-15 of the step) of two n8 channel tiles.
  template <class Accumulator, int kRegisters>
  static __device__ __forceinline__ void multiply_p_v(Accumulator (&o_accumulator)[kRowTiles][kOutputTiles][kRegisters],
                                                      const unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                      unsigned v_tile, int lane) {
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
          pv_mma<Config>(o_accumulator[row_tile][tile], p_fragment[row_tile][step], v_fragment[0], v_fragment[1]);
          pv_mma<Config>(o_accumulator[row_tile][tile + 1], p_fragment[row_tile][step], v_fragment[2], v_fragment[3]);
        }
      }
  }
};

} // namespace sage::device::sm80
