// The quantization prologue's reductions over a row's lanes, over the CTA and over the columns of a token tile. The
// generator pastes this header after its constants (kThreads, kHeadDim, kVectorElements, kVectorsPerRow, kLanesPerRow,
// kRowsPerPass) and token_tile.cuh, whose names it uses. Lanes that hold no vector (token_tile.cuh) count as the
// reductions' identity.
#pragma once

namespace sage::device::prologue {

// combine(value, value of another lane) over the lanes that hold one row; lanes that hold no vector bring 0.
template <class Combine> __device__ __forceinline__ float rowReduce(float value, Combine combine) {
  if (!laneHoldsVector())
    value = 0.0f;
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2)
    value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Max of non-negative values over the lanes that hold one row.
__device__ __forceinline__ float rowMax(float value) {
  return rowReduce(value, [](float a, float b) { return fmaxf(a, b); });
}

// The f32 sum over the lanes that hold one row.
__device__ __forceinline__ float rowSum(float value) {
  return rowReduce(value, [](float a, float b) { return __fadd_rn(a, b); });
}

// Max of non-negative values over the CTA (a NaN never wins, like max.f32). `slot`: one word of shared memory.
__device__ __forceinline__ float ctaMax(float value, unsigned *slot) {
  if (threadIdx.x == 0)
    *slot = 0u;
  __syncthreads();
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if (threadIdx.x % 32 == 0)
    atomicMax(slot, __float_as_uint(value)); // non-negative floats order like their bits
  __syncthreads();
  const float result = __uint_as_float(*slot);
  __syncthreads(); // the slot may be reused right after
  return result;
}

// Folds per-thread partial results of 8 channels over the CTA's kRowsPerPass rows of threads: every thread that holds
// a vector writes its partials to `partials` [kRowsPerPass x kHeadDim], then thread c combines channel c's rows in
// order and hands the result to store(c, value).
template <class Combine, class Store>
__device__ __forceinline__ void foldRows(const float (&mine)[kVectorElements], float *partials, float identity,
                                         Combine combine, Store store) {
  float *slot = partials + (int)threadIdx.x / kLanesPerRow * kHeadDim + channelOfLane();
  if (laneHoldsVector())
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      slot[j] = mine[j];
  __syncthreads();
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    float total = identity;
    for (int row = 0; row < kRowsPerPass; ++row)
      total = combine(total, partials[row * kHeadDim + c]);
    store(c, total);
  }
  __syncthreads();
}

// Per-channel mean of rows [0, valid_rows) of a tile: f32 sums in a fixed order, one f32 division (0 for no rows: a
// Q block past a packed sequence).
template <class Tile, class Values>
__device__ __forceinline__ void tileColumnMeans(const Values &values, int valid_rows, float *partials, float *means) {
  float sum[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    sum[j] = 0.0f;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass)
    if (Tile::row(pass) < valid_rows)
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        sum[j] = __fadd_rn(sum[j], values(pass, j));
  foldRows(
      sum, partials, 0.0f, [](float a, float b) { return __fadd_rn(a, b); },
      [&](int c, float total) { means[c] = valid_rows > 0 ? __fdiv_rn(total, (float)valid_rows) : 0.0f; });
}

// Largest |x| of a whole tile (a per-tensor quantizer's share of the amax).
template <class Tile, class Values> __device__ __forceinline__ float tileAmax(const Values &values, unsigned *slot) {
  float amax = 0.0f;
  if (laneHoldsVector())
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass)
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        amax = fmaxf(amax, fabsf(values(pass, j)));
  return ctaMax(amax, slot);
}

} // namespace sage::device::prologue
