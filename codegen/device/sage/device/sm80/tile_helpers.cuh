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

// Copies a kRows x kRowBytes tile (global rows `row_stride` bytes apart) into a swizzled shared tile with
// cp.async by the CTA's kThreads threads: thread t copies chunk t % kRowChunks of rows t / kRowChunks + pass *
// kRowsPerPass. With kZeroFillTail, rows at or past `valid_rows` (past the end of the sequence) are zero-filled instead
// of read.
template <int kThreads, int kRows, int kRowBytes, bool kZeroFillTail>
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

} // namespace sage::device::sm80
