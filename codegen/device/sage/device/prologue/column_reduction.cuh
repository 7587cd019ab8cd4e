// The column statistics roles of the quantization prologue's launch 1: per-channel sums and/or minima and maxima over
// a slice of one KV head's tokens of K or V, into prologue_statistics. The generator pastes this header after its
// constants (kThreads, kHeadDim, kVectorElements, kVectorsPerRow, kRowsPerPass, kStatisticsUnroll), geometry.cuh,
// scalar_helpers.cuh, the input header, global_memory.cuh, sequences.cuh, tile_reductions.cuh (foldRows) and its
// statistics scratch (statisticsScratch), whose names it uses.
#pragma once

namespace sage::device::prologue {

// Per-channel sum and/or min and max of rows [begin, end) of one head. Each thread reduces every
// kRowsPerPass-th row of its 8 channels with kStatisticsUnroll loads in flight; then thread c folds the
// kRowsPerPass partial results of channel c in order into this slice's entries.
template <bool kSum, bool kMinMax>
__device__ __forceinline__ void reduceColumns(const unsigned short *head, long long token_stride, int begin, int end,
                                              float *partials, float *sum_out, unsigned short *min_out,
                                              unsigned short *max_out) {
  const int channel = channelOfLane(); // lanes that hold no vector (token_tile.cuh) load nothing
  float sum[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    sum[j] = 0.0f;
  // Minima and maxima of the inputs as they are, two channels a word: exact, and no conversion per element.
  unsigned low_pairs[kVectorElements / 2], high_pairs[kVectorElements / 2];
#pragma unroll
  for (int w = 0; w < kVectorElements / 2; ++w) {
    low_pairs[w] = kPositiveInfinityPair;
    high_pairs[w] = kNegativeInfinityPair;
  }
  for (int row = begin + (int)threadIdx.x / kLanesPerRow; row < end; row += kRowsPerPass * kStatisticsUnroll) {
    uint4 raw[kStatisticsUnroll];
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u) {
      const int r = row + u * kRowsPerPass;
      raw[u] = r < end && laneHoldsVector() ? loadVector(head + r * token_stride + channel) : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < kStatisticsUnroll; ++u)
      if (row + u * kRowsPerPass < end) {
        if constexpr (kSum)
#pragma unroll
          for (int j = 0; j < kVectorElements; ++j)
            sum[j] = __fadd_rn(sum[j], elementOf(raw[u], j));
        if constexpr (kMinMax) {
          const unsigned words[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
#pragma unroll
          for (int w = 0; w < kVectorElements / 2; ++w) {
            low_pairs[w] = extremeOfPairs<false>(low_pairs[w], words[w]);
            high_pairs[w] = extremeOfPairs<true>(high_pairs[w], words[w]);
          }
        }
      }
  }
  float low[kVectorElements], high[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j) {
    low[j] = inputToFloat(j % 2 == 0 ? low_pairs[j / 2] & 0xffffu : low_pairs[j / 2] >> 16);
    high[j] = inputToFloat(j % 2 == 0 ? high_pairs[j / 2] & 0xffffu : high_pairs[j / 2] >> 16);
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

// One CTA of a column statistics role: slice `cta % slices` of KV head `cta / slices` of K (kK) or V, reduced into
// the slice's entries of the sums (kSum) and/or minima and maxima (kMinMax). Launch 2 combines the slices in order.
template <bool kK, bool kSum, bool kMinMax>
__device__ __forceinline__ void reduceColumnsOfSlice(const SagePrologueParams &params, long long cta,
                                                     unsigned char *shared) {
  const int slices = statisticsSlices(params.size);
  const long long head = cta / slices; // batch index * heads_kv + KV head index
  const int slice = (int)(cta % slices);
  const SequenceRows rows = kK ? keyRows(params, head) : valueRows(params, head);
  const int slice_tokens = statisticsSliceTokens(rows.length, slices);
  const int begin = slice * slice_tokens;
  const int end = min(rows.length, begin + slice_tokens); // empty past a short sequence: the identities are stored
  const StatisticsScratch scratch = statisticsScratch(params);
  const long long entry = (head * slices + slice) * kHeadDim;
  float *sum = nullptr;
  unsigned short *lowest = nullptr, *highest = nullptr;
  if constexpr (kSum)
    sum = (kK ? scratch.k_sum : scratch.v_sum) + entry;
  if constexpr (kMinMax) {
    lowest = (kK ? scratch.k_min : scratch.v_min) + entry;
    highest = (kK ? scratch.k_max : scratch.v_max) + entry;
  }
  reduceColumns<kSum, kMinMax>(rows.rows, rows.token_stride, begin, end, (float *)shared, sum, lowest, highest);
}

} // namespace sage::device::prologue
