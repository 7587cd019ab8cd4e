// The tile copies of the sm80 (mma.sync) attention kernel: global tiles into swizzled shared tiles with cp.async. The
// index arithmetic (swizzle, scale groups, S's columns) is sage/device/sm80/layout.cuh.
#pragma once

#include "sage/device/lanes.cuh"
#include "sage/device/sm80/instructions.cuh"
#include "sage/device/sm80/layout.cuh"

namespace sage::device::sm80 {

using sage::device::negative_infinity;
using sage::device::quad_max;
using sage::device::quad_sum;

// Copies a kRows x kSourceRowBytes tile (global rows `row_stride` bytes apart) into a swizzled shared tile of
// kRowBytes rows with cp.async by the CTA's kThreads threads. With kZeroFillTail, rows at or past `valid_rows` (past
// the end of the sequence) are zero-filled instead of read.
// Whole rows whose passes advance by whole 8-row swizzle groups: thread t copies chunk t % kRowChunks of rows
// t / kRowChunks + pass * kRowsPerPass. Otherwise (padded rows, where a head dim's row is not a power of two of
// chunks and the schedule pads kRowBytes to one; or rows too wide for 8 per pass, d > 128 with 4 warps): the CTA
// walks the rows' chunks up to kSourceRowBytes rounded up to kQkStepBytes, each with its own swizzled address, and
// zero-fills those past kSourceRowBytes (int8 Q/K at d = 80: the Q.K^T mma's last k32 step reads zeros there); the
// rest of a padded row stays unwritten.
template <int kThreads, int kRows, int kRowBytes, bool kZeroFillTail, int kSourceRowBytes = kRowBytes>
__device__ __forceinline__ void copy_tile_async(unsigned shared_tile, const unsigned char *global_tile,
                                                long long row_stride, int valid_rows) {
  constexpr int kRowChunks = kRowBytes / kChunkBytes;
  static_assert((kRowChunks & (kRowChunks - 1)) == 0, "shared rows are a power of two of 16-byte chunks");
  static_assert(kSourceRowBytes % kChunkBytes == 0 && kSourceRowBytes <= kRowBytes, "rows of whole chunks that fit");
  if constexpr (kSourceRowBytes != kRowBytes || kThreads % kRowChunks != 0 ||
                (kThreads / kRowChunks) % kLdmatrixRows != 0) {
    constexpr int kSourceChunks = kSourceRowBytes / kChunkBytes;
    constexpr int kFilledChunks = (kSourceRowBytes + kQkStepBytes - 1) / kQkStepBytes * (kQkStepBytes / kChunkBytes);
    static_assert(kFilledChunks <= kRowChunks, "the zero-filled chunks lie inside the shared row");
    constexpr int kChunks = kRows * kFilledChunks;
#pragma unroll
    for (int pass = 0; pass < (kChunks + kThreads - 1) / kThreads; ++pass) {
      const int index = static_cast<int>(threadIdx.x) + pass * kThreads;
      if (kChunks % kThreads == 0 || index < kChunks) {
        const int row = index / kFilledChunks, chunk = index % kFilledChunks;
        const bool fill = chunk < kSourceChunks && (!kZeroFillTail || row < valid_rows);
        cp_async_16(shared_tile + swizzled_offset<kRowChunks>(row, chunk),
                    fill ? global_tile + row * row_stride + chunk * kChunkBytes : global_tile, fill);
      }
    }
  } else {
    constexpr int kRowsPerPass = kThreads / kRowChunks;
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
}

} // namespace sage::device::sm80
