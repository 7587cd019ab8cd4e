// Helpers that every kernel family shares (sm80, sm90, sm120, SLA): -inf without the standard library, the
// reductions over the four lanes of a quad, which hold one row of an mma accumulator between them, and the walk over
// a warp's grid of mma accumulator tiles.
#pragma once

namespace sage::device {

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

// f(m, n, i) for register i of each 16 x 8 accumulator tile of an M x N grid (4 registers per lane each), fully
// unrolled; i / 2 is the tile's row half, i % 2 its column in the pair.
template <int M, int N, class F> __device__ __forceinline__ void for_each_fragment(F f) {
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        f(m, n, i);
}

// Zeroes accumulator tiles (4 floats per lane each): a row of N tiles, or an M x N grid.
template <int N> __device__ __forceinline__ void clear_tiles(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      c[n][i] = 0.0f;
}
template <int M, int N> __device__ __forceinline__ void clear_tiles(float (&c)[M][N][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m)
    clear_tiles(c[m]);
}

} // namespace sage::device
