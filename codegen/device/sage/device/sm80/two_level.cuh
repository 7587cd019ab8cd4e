// Two-level accumulation of the sm80 (mma.sync) attention kernel: every kFlushPeriod KV blocks the P.V mma's
// accumulator (f16, or f32) is added into an outer f32 one and restarted.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/sm80/geometry.cuh"

namespace sage::device::sm80 {

// kRegisters per n8 tile: 2 for an f16 accumulator (f16x2 words), 4 for an f32 one.
template <class Config, class Accumulator, int kRegisters, int kRowTiles = Geometry<Config>::kRowTiles,
          int kOutputTiles = Geometry<Config>::kOutputTiles>
__device__ __forceinline__ void flush_accumulator(float (&o_flushed)[kRowTiles][kOutputTiles][4],
                                                  Accumulator (&o_accumulator)[kRowTiles][kOutputTiles][kRegisters]) {
  static_assert(kRegisters == 2 || kRegisters == 4, "an f16 (2 words) or f32 (4 floats) accumulator");
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile) {
      if constexpr (kRegisters == 2) { // ---- Step: add the f16 accumulator into the f32 one and restart it ----
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float low, high;
          unpack_f16x2(o_accumulator[row_tile][tile][half], low, high);
          o_flushed[row_tile][tile][half * 2] += low;
          o_flushed[row_tile][tile][half * 2 + 1] += high;
          o_accumulator[row_tile][tile][half] = 0u;
        }
      } else { // ---- Step: add the mma's f32 accumulator into the outer one and restart it ----
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o_flushed[row_tile][tile][i] += o_accumulator[row_tile][tile][i];
          o_accumulator[row_tile][tile][i] = 0.0f;
        }
      }
    }
}

} // namespace sage::device::sm80
