// Launch 1's results for launch 2 of the quantization prologue, in the workspace's prologue_statistics: where each
// lies, and how launch 2 combines a channel's slices. The generator pastes this header after its constants
// (kHeadDim), scalar_helpers.cuh and the input header, whose names it uses, then emits `statisticsScratch(params)`,
// which lays out the fields the variant has.
#pragma once

namespace sage::device::prologue {

// A per-tensor Q's block amax, then column statistics of K and V per (head, slice): at most 16 bytes per channel
// and slice, with slices <= min(64, ceil(tokens_kv / 16)), the bound the workspace is sized for. Minima and
// maxima are stored as input elements, which holds them exactly.
struct StatisticsScratch {
  float *q_amax;                                 // [batch * heads_q][padded_q / kBlockQ]
  float *k_sum, *v_sum;                          // [batch * heads_kv][slices][kHeadDim]
  unsigned short *k_min, *k_max, *v_min, *v_max; // [batch * heads_kv][slices][kHeadDim]
};

// Slices are read kSliceBatch at a time, all loads issued before the first is used: every K and V tile of launch 2
// combines its head's statistics, and one dependent L2 load per slice (16-32 per head) made that combination, not the
// tile's own bytes, the launch's critical path (ncu, H200: 2.0 TB/s of DRAM in launch 2 against 3.3 in launch 1).
constexpr int kSliceBatch = 16;

// One channel's statistics over the whole sequence, from its entries of launch 1's slices (`first_entry`,
// `first_entry + kHeadDim`, ...) combined in slice order. The mean: the slices' sums added in order, one f32 division.
__device__ __forceinline__ float combinedMean(const float *sums, long long first_entry, int slices, int tokens) {
  float sum = 0.0f;
  for (int first = 0; first < slices; first += kSliceBatch) {
    float part[kSliceBatch];
#pragma unroll
    for (int i = 0; i < kSliceBatch; ++i)
      part[i] = first + i < slices ? sums[first_entry + (first + i) * kHeadDim] : 0.0f;
#pragma unroll
    for (int i = 0; i < kSliceBatch; ++i)
      if (first + i < slices)
        sum = __fadd_rn(sum, part[i]);
  }
  return __fdiv_rn(sum, (float)tokens);
}

// The amax of x - mean (kCentred: x -> x - mean is monotonic in f32, so the minimum and maximum bound every token),
// or of x.
template <bool kCentred>
__device__ __forceinline__ float combinedAmax(const unsigned short *minima, const unsigned short *maxima,
                                              long long first_entry, int slices, [[maybe_unused]] float mean) {
  float low = positiveInfinity(), high = -positiveInfinity();
  for (int first = 0; first < slices; first += kSliceBatch) {
    unsigned short lows[kSliceBatch], highs[kSliceBatch];
#pragma unroll
    for (int i = 0; i < kSliceBatch; ++i) {
      const bool inside = first + i < slices;
      lows[i] = inside ? minima[first_entry + (first + i) * kHeadDim] : (unsigned short)0;
      highs[i] = inside ? maxima[first_entry + (first + i) * kHeadDim] : (unsigned short)0;
    }
#pragma unroll
    for (int i = 0; i < kSliceBatch; ++i)
      if (first + i < slices) {
        low = fminf(low, inputToFloat(lows[i]));
        high = fmaxf(high, inputToFloat(highs[i]));
      }
  }
  if constexpr (kCentred)
    return fmaxf(fabsf(__fsub_rn(high, mean)), fabsf(__fsub_rn(low, mean)));
  else
    return fmaxf(fabsf(high), fabsf(low));
}

} // namespace sage::device::prologue
