// The column reduction of the quantization prologue's launch 1: per-channel sums and/or minima and maxima over a
// slice of one head's tokens. The generator pastes this header after its constants (kThreads, kHeadDim,
// kVectorElements, kVectorsPerRow, kRowsPerPass, kStatisticsUnroll), scalar_helpers.cuh, the input header,
// global_memory.cuh and tile_reductions.cuh (foldRows), whose names it uses.
#pragma once

namespace sage::device::prologue {

// Per-channel sum and/or min and max of rows [begin, end) of one head. Each thread reduces every
// kRowsPerPass-th row of its 8 channels with kStatisticsUnroll loads in flight; then thread c folds the
// kRowsPerPass partial results of channel c in order into this slice's entries.
template <bool kSum, bool kMinMax>
__device__ __forceinline__ void reduceColumns(const unsigned short *head, long long token_stride, int begin, int end,
                                              float *partials, float *sum_out, unsigned short *min_out,
                                              unsigned short *max_out) {
  const int channel = (int)threadIdx.x % kVectorsPerRow * kVectorElements;
  float sum[kVectorElements], low[kVectorElements], high[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j) {
    sum[j] = 0.0f;
    low[j] = positiveInfinity();
    high[j] = -positiveInfinity();
  }
  for (int row = begin + (int)threadIdx.x / kVectorsPerRow; row < end; row += kRowsPerPass * kStatisticsUnroll) {
    uint4 raw[kStatisticsUnroll];
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u) {
      const int r = row + u * kRowsPerPass;
      raw[u] = r < end ? loadVector(head + r * token_stride + channel) : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u)
      if (row + u * kRowsPerPass < end)
#pragma unroll
        for (int j = 0; j < kVectorElements; ++j) {
          const float value = elementOf(raw[u], j);
          if constexpr (kSum)
            sum[j] = __fadd_rn(sum[j], value);
          if constexpr (kMinMax) {
            low[j] = fminf(low[j], value);
            high[j] = fmaxf(high[j], value);
          }
        }
  }
  if constexpr (kSum)
    foldRows(
        sum, partials, 0.0f, [](float a, float b) { return __fadd_rn(a, b); },
        [&](int c, float total) { sum_out[c] = total; });
  if constexpr (kMinMax) {
    foldRows(
        low, partials, positiveInfinity(), [](float a, float b) { return fminf(a, b); },
        [&](int c, float lowest) { min_out[c] = floatToInput(lowest); });
    foldRows(
        high, partials, -positiveInfinity(), [](float a, float b) { return fmaxf(a, b); },
        [&](int c, float highest) { max_out[c] = floatToInput(highest); });
  }
}

} // namespace sage::device::prologue
