// FP4 by emulation in the sm80 (mma.sync) attention kernel (PvPath::e2m1_decoded, the legalized program on a target
// without the block-scaled mma): the decode of staged e2m1 codes x microscales into 16-bit tiles in shared memory,
// P~'s microscaling in registers (reference::quantizeProbabilities' f32 steps) and the P.V product over the decoded
// V_j^T. The arithmetic on single values is sage/device/fp4/microscaling.cuh, host-tested against sage::numerics.
// The 16-bit type the codes decode to is the Config's Q.K^T operand (sage::fp4DecodedType: f16 for NVFP4, bf16 for
// MXFP4); both products are m16n8k16 mma of that type with an f32 accumulator.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/fp4/microscaling.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

template <class Config> struct Fp4Steps {
  using G = Geometry<Config>;
  static constexpr int kRowTiles = G::kRowTiles, kScoreTiles = G::kScoreTiles, kOutputTiles = G::kOutputTiles;
  static constexpr int kPvSteps = G::kPvSteps, kThreads = G::kThreads, kVRowBytes = Config::kVRowBytes;
  static constexpr int kFp4Group = Config::kFp4Group;
  static constexpr bool kTwoLevelP = Config::kTwoLevelP;
  static_assert(G::kFp4, "FP4 by emulation");

  // ---- Shared-memory words ----
  static __device__ __forceinline__ unsigned load_shared_u32(unsigned address) {
    unsigned value;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address));
    return value;
  }

  static __device__ __forceinline__ void store_shared_v4(unsigned address, unsigned x, unsigned y, unsigned z,
                                                         unsigned w) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(x), "r"(y), "r"(z), "r"(w));
  }

  // Two decoded values (exactly representable) as the mma's 16-bit x2 operand register; `low` in bits 0-15
  static __device__ __forceinline__ unsigned pack_decoded(float low, float high) {
    if constexpr (Config::kQk == QkOperands::bf16)
      return pack_bf16x2(low, high);
    else
      return pack_f16x2(low, high);
  }

  // ---- Step: e2m1 codes x microscales -> 16-bit tiles in shared memory (exact: the legalization's sage.decode) ----
  // A tile of kRows x kElements codes as copy_tile_async staged it (kElements / 2 bytes per row, swizzled), its
  // scales one byte per kFp4Group elements, `scale_row_stride` bytes between rows (shared memory or the workspace).
  // Each thread decodes one code word at a time: 8 elements, one 16-byte chunk of the decoded (swizzled) row.
  template <int kRows, int kElements>
  static __device__ __forceinline__ void decode_fp4_tile(unsigned decoded_tile, unsigned code_tile,
                                                         const unsigned char *scales, int scale_row_stride) {
    constexpr int kWordsPerRow = kElements / 8;
    constexpr int kCodeRowChunks = kElements / 2 / kChunkBytes;
    constexpr int kDecodedRowChunks = kElements * 2 / kChunkBytes;
    constexpr int kWordsPerChunk = kChunkBytes / 4;
    for (int word = static_cast<int>(threadIdx.x); word < kRows * kWordsPerRow; word += kThreads) {
      const int row = word / kWordsPerRow, column = word % kWordsPerRow;
      const unsigned codes = load_shared_u32(code_tile + swizzled_offset<kCodeRowChunks>(row, column / kWordsPerChunk) +
                                             (column % kWordsPerChunk) * 4);
      const float scale = fp4::microscale_value(scales[row * scale_row_stride + column * 8 / kFp4Group], kFp4Group);
      float values[8];
      fp4::decode_e2m1x8(codes, scale, values);
      store_shared_v4(decoded_tile + swizzled_offset<kDecodedRowChunks>(row, column),
                      pack_decoded(values[0], values[1]), pack_decoded(values[2], values[3]),
                      pack_decoded(values[4], values[5]), pack_decoded(values[6], values[7]));
    }
  }

  // ---- Step: P~_i^j microscaled in registers (Algorithm 1, line 10; reference::quantizeProbabilities) ----
  // Two-level (kTwoLevelP): s_P1 = rowmax(P~) / 2688 per row, then P~ / s_P1 microscaled; direct: P~ itself.
  // Two adjacent n8 tiles of S hold tokens 16s .. 16s + 15 of the block (columns 2t, 2t + 1 of each, rows g and
  // g + 8), so a group of kFp4Group tokens is kGroupTiles tiles spread over the 4 lanes of a quad: its amax is a quad
  // max. Each P~ is replaced by its code's value x the group's scale (exact in the 16-bit type), then packed as the A
  // fragment of the P.V mma (m16n8k16 over those 16 tokens). p_row_scale gets s_P1 (1 for direct P).
  static __device__ __forceinline__ void quantize_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                                float (&p_row_scale)[kRowTiles][2],
                                                                float (&probabilities)[kRowTiles][kScoreTiles][4]) {
    constexpr int kGroupTiles = kFp4Group / kMmaColumns;
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        fp4::RowScale row{1.0f, 1.0f};
        if constexpr (kTwoLevelP) { // s_P1 = rowmax(P~) / (448 x 6) over this S tile's row
          float row_max = 0.0f;
#pragma unroll
          for (int tile = 0; tile < kScoreTiles; ++tile)
            row_max = fmaxf(
                row_max, fmaxf(probabilities[row_tile][tile][half * 2], probabilities[row_tile][tile][half * 2 + 1]));
          row = fp4::probability_row_scale(quad_max(row_max));
        }
        p_row_scale[row_tile][half] = row.scale;
#pragma unroll
        for (int group = 0; group < kScoreTiles / kGroupTiles; ++group) {
          float amax = 0.0f;
#pragma unroll
          for (int tile = group * kGroupTiles; tile < (group + 1) * kGroupTiles; ++tile)
#pragma unroll
            for (int column = 0; column < 2; ++column) {
              float &x = probabilities[row_tile][tile][half * 2 + column];
              if constexpr (kTwoLevelP)
                x = fp4::multiply_rn(x, row.inverse);
              amax = fp4::max_magnitude(amax, x);
            }
          const unsigned scale_code = fp4::microscale_code(quad_max(amax), kFp4Group);
          const float scale = fp4::microscale_value(scale_code, kFp4Group);
          const float inverse = fp4::microscale_inverse(scale_code, kFp4Group);
#pragma unroll
          for (int tile = group * kGroupTiles; tile < (group + 1) * kGroupTiles; ++tile)
#pragma unroll
            for (int column = 0; column < 2; ++column) {
              float &x = probabilities[row_tile][tile][half * 2 + column];
              x = fp4::quantize_probability(x, scale, inverse);
            }
        }
      }
    pack_score_pairs(p_fragment, probabilities, [](float low, float high) { return pack_decoded(low, high); });
  }

  // ---- Step: O_i^j += s_P1 (P^_i^j V^_j) (two-level P), O_i^j += P^_i^j V^_j (direct P) ----
  // V_j^T decoded (channel-major, kVRowBytes per channel) is the B operand's own layout: plain ldmatrix, one 8x8
  // matrix per 8 tokens of 8 channels; one x4 covers two k steps of one n8 channel tile. The block's product (f32) is
  // scaled by s_P1 per row (two-level P), then added into O.
  static __device__ __forceinline__ void multiply_p_v(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                                      const unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                      const float (&p_row_scale)[kRowTiles][2], unsigned v_tile,
                                                      int lane) {
    constexpr int kRowChunks = kVRowBytes / kChunkBytes; // one chunk = 8 tokens
    static_assert(kPvSteps % 2 == 0, "one ldmatrix.x4 covers two k steps");
    const unsigned lane_offset = swizzled_offset<kRowChunks>(lane % kLdmatrixRows, lane / kLdmatrixRows);
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile) {
      float block_product[kRowTiles][4];
      clear_tiles(block_product);
#pragma unroll
      for (int pair = 0; pair < kPvSteps / 2; ++pair) {
        unsigned v_fragment[4];
        ldmatrix_x4(v_fragment, tile_address(v_tile, lane_offset, tile * kMmaColumns * kVRowBytes, pair * 4));
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
          pv_mma<Config>(block_product[row_tile], p_fragment[row_tile][2 * pair], v_fragment[0], v_fragment[1]);
          pv_mma<Config>(block_product[row_tile], p_fragment[row_tile][2 * pair + 1], v_fragment[2], v_fragment[3]);
        }
      }
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kTwoLevelP)
            o_accumulator[row_tile][tile][i] += p_row_scale[row_tile][i / 2] * block_product[row_tile][i];
          else
            o_accumulator[row_tile][tile][i] += block_product[row_tile][i];
        }
    }
  }
};

} // namespace sage::device::sm80
