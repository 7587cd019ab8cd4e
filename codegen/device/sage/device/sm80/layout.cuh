// The index arithmetic of the sm80 (mma.sync) attention kernel: the fixed sizes of mma.sync, ldmatrix and cp.async,
// swizzled shared-memory addressing, scale groups and the map from S's columns to KV tokens. Plain integer functions,
// compiled by NVRTC for the kernel and by the host compiler for the tests (tests/codegen/Sm80LayoutTest.cpp checks them
// against sage/codegen/FragmentLayout.h and sage/schedules/WorkspaceLayout.h), so both read one definition.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define SAGE_SM80_LAYOUT_FUNCTION __host__ __device__ __forceinline__ constexpr
#else
#define SAGE_SM80_LAYOUT_FUNCTION inline constexpr
#endif

namespace sage::device::sm80 {

// ---- The instructions' fixed sizes ----
constexpr int kWarpSize = 32;
constexpr int kMmaRows = 16;       // m of every mma
constexpr int kMmaColumns = 8;     // n of every mma
constexpr int kRowHalf = 8;        // a thread holds rows g and g + kRowHalf of an m16 tile
constexpr int kLanesPerRow = 4;    // lanes sharing an accumulator row (PTX: threadID_in_group)
constexpr int kQkStepBytes = 32;   // bytes of a row one Q.K^T mma consumes (its k extent)
constexpr int kChunkBytes = 16;    // one cp.async copy, one ldmatrix row
constexpr int kBankLineChunks = 8; // 128 bytes cover all 32 shared-memory banks
constexpr int kLdmatrixRows = 8;   // rows of one ldmatrix 8x8 matrix

// ---- Shared-memory tiles ----
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowChunks chunks per row. The chunk index is
// XORed with the row's position among the rows that share a 128-byte bank line, so the 8 rows one ldmatrix phase
// reads, and the 8 chunks one cp.async phase writes, land in 8 different groups of 4 banks: no bank conflicts.
template <int kRowChunks> SAGE_SM80_LAYOUT_FUNCTION unsigned swizzled_offset(int row, int chunk) {
  constexpr int kRowsPerBankLine = kRowChunks >= kBankLineChunks ? 1 : kBankLineChunks / kRowChunks;
  constexpr int kSwizzlePattern = kRowChunks >= kBankLineChunks ? kBankLineChunks : kRowChunks;
  return (row * kRowChunks + (chunk ^ ((row / kRowsPerBankLine) % kSwizzlePattern))) * kChunkBytes;
}

// The address of (lane row + a whole number of 8-row groups, lane chunk + a chunk step whose bits are disjoint
// from the lane's): adding 8-row groups keeps a row's swizzle, and such a chunk step commutes with the XOR. So
// each lane computes swizzled_offset once, and every ldmatrix of a loop only adds/XORs compile-time constants.
SAGE_SM80_LAYOUT_FUNCTION unsigned tile_address(unsigned tile, unsigned lane_offset, int row_step_bytes,
                                                int chunk_step) {
  return tile + (lane_offset ^ static_cast<unsigned>(chunk_step * kChunkBytes)) + row_step_bytes;
}

// ---- Scale groups ----
// Index of the scale of `token` (0-based in the sequence) for a quantizer with these groups
template <int kTokensPerGroup, int kInterleave> SAGE_SM80_LAYOUT_FUNCTION int scale_group(int token) {
  if constexpr (kTokensPerGroup == 0)
    return 0;
  else
    return token / kTokensPerGroup * kInterleave + token % kInterleave;
}

// The KV token of column `column` of n8 tile `tile` of S_i^j, within the block: the K rows feeding S in token
// order (kInterleaved false), or permuted for 8-bit P.V (true; kPvStepTokens: the k of its m16n8k32 mma).
template <bool kInterleaved, int kPvStepTokens> struct ScoreColumns {
  static SAGE_SM80_LAYOUT_FUNCTION int kv_token_of_column(int tile, int column) {
    if constexpr (kInterleaved) {
      // 8-bit P.V reads P~ as the A operand of m16n8k32, where a thread needs 4 consecutive tokens per register; an
      // S accumulator gives it only 2 consecutive columns per n8 tile. So the K rows feeding S are permuted: within
      // each group of 4 tiles (32 tokens), column 2c + b of tile 2h + s holds token 16h + 4c + 2s + b. Then tiles 2h
      // and 2h + 1 of a thread pack into the A register for tokens 16h + 4c .. 16h + 4c + 3 with no data movement.
      constexpr int kTilesPerStep = kPvStepTokens / kMmaColumns;
      const int step = tile / kTilesPerStep, tile_in_step = tile % kTilesPerStep;
      const int step_half = tile_in_step / 2, tile_in_half = tile_in_step % 2;
      return step * kPvStepTokens + step_half * (kPvStepTokens / 2) + (column / 2) * 4 + tile_in_half * 2 + column % 2;
    } else {
      return tile * kMmaColumns + column;
    }
  }
};

} // namespace sage::device::sm80
