// The tile helpers of the sm80 (mma.sync) attention kernel: swizzled shared-memory addressing, cp.async tile copies,
// scale groups and the map from S's columns to KV tokens. The generated kernel includes this header
// after its constants (kChunkBytes, kBankLineChunks, kThreads, kLdmatrixRows, kMmaColumns, kPvStepTokens) and PTX
// wrappers (cp_async_16), whose names it uses.
#pragma once

#include "sage/device/lanes.cuh"

namespace sage::device::sm80 {

using sage::device::negative_infinity;
using sage::device::quad_max;
using sage::device::quad_sum;

// ---- Shared-memory tiles ----
// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRowChunks chunks per row. The chunk index is
// XORed with the row's position among the rows that share a 128-byte bank line, so the 8 rows one ldmatrix phase
// reads, and the 8 chunks one cp.async phase writes, land in 8 different groups of 4 banks: no bank conflicts.
template <int kRowChunks> __device__ __forceinline__ unsigned swizzled_offset(int row, int chunk) {
  constexpr int kRowsPerBankLine = kRowChunks >= kBankLineChunks ? 1 : kBankLineChunks / kRowChunks;
  constexpr int kSwizzlePattern = kRowChunks >= kBankLineChunks ? kBankLineChunks : kRowChunks;
  return (row * kRowChunks + (chunk ^ ((row / kRowsPerBankLine) % kSwizzlePattern))) * kChunkBytes;
}

// The address of (lane row + a whole number of 8-row groups, lane chunk + a chunk step whose bits are disjoint
// from the lane's): adding 8-row groups keeps a row's swizzle, and such a chunk step commutes with the XOR. So
// each lane computes swizzled_offset once, and every ldmatrix of a loop only adds/XORs compile-time constants.
__device__ __forceinline__ unsigned tile_address(unsigned tile, unsigned lane_offset, int row_step_bytes,
                                                 int chunk_step) {
  return tile + (lane_offset ^ static_cast<unsigned>(chunk_step * kChunkBytes)) + row_step_bytes;
}

// Copies a kRows x kRowBytes tile (global rows `row_stride` bytes apart) into a swizzled shared tile with
// cp.async: thread t copies chunk t % kRowChunks of rows t / kRowChunks + pass * kRowsPerPass. With
// kZeroFillTail, rows at or past `valid_rows` (past the end of the sequence) are zero-filled instead of read.
template <int kRows, int kRowBytes, bool kZeroFillTail>
__device__ __forceinline__ void copy_tile_async(unsigned shared_tile, const unsigned char *global_tile,
                                                long long row_stride, int valid_rows) {
  constexpr int kRowChunks = kRowBytes / kChunkBytes;
  constexpr int kRowsPerPass = kThreads / kRowChunks;
  static_assert(kRowsPerPass % kLdmatrixRows == 0, "each pass must advance by whole 8-row swizzle groups");
  const int row = static_cast<int>(threadIdx.x) / kRowChunks, chunk = static_cast<int>(threadIdx.x) % kRowChunks;
  const unsigned shared_chunk = shared_tile + swizzled_offset<kRowChunks>(row, chunk);
  const unsigned char *source = global_tile + row * row_stride + chunk * kChunkBytes;
#pragma unroll
  for (int pass = 0; pass < (kRows + kRowsPerPass - 1) / kRowsPerPass; ++pass) {
    if (kRows % kRowsPerPass == 0 || row + pass * kRowsPerPass < kRows) {
      const bool fill = !kZeroFillTail || row + pass * kRowsPerPass < valid_rows;
      cp_async_16(shared_chunk + pass * kRowsPerPass * kRowBytes,
                  fill ? source + pass * kRowsPerPass * row_stride : global_tile, fill);
    }
  }
}

// A compile-time flag passed to the main loop's generic lambda: Masked<true>{} selects the masked step.
template <bool kValue> struct Masked { static constexpr bool value = kValue; };

// ---- Scale groups ----
// Index of the scale of `token` (0-based in the sequence) for a quantizer with these groups
template <int kTokensPerGroup, int kInterleave> __device__ __forceinline__ int scale_group(int token) {
  if constexpr (kTokensPerGroup == 0)
    return 0;
  else
    return token / kTokensPerGroup * kInterleave + token % kInterleave;
}

// The KV token of column `column` of n8 tile `tile` of S_i^j, within the block: the K rows feeding S in token
// order (kInterleaved false), or permuted for 8-bit P.V (true).
template <bool kInterleaved> struct ScoreColumns {
  static __device__ __forceinline__ int kv_token_of_column(int tile, int column) {
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
