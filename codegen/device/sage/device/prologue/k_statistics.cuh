// The statistics of K over the whole sequence for the quantization prologue's psi_K (launch 2), combined from launch
// 1's slices: mean(K) when K is smoothed, the amax of a per-tensor psi_K (kMinMax). The prologue generator pastes
// this header after its constants, its statistics scratch (statisticsScratch), geometry.cuh, scalar_helpers.cuh, the
// input header, global_memory.cuh, sequences.cuh and tile_reductions.cuh (ctaMax), whose names it uses.
#pragma once

namespace sage::device::prologue {

// Channel by channel (this thread's channels), mean(K) over the head's `tokens` (its slot's sequence; the slices' sums
// in slice order, one f32 division; 0 when K is not smoothed or has no token), handed to emit(c, mean); returns this
// thread's share of the per-tensor psi_K's amax (kMinMax: max |K - mean(K)| or max |K| over its channels; else 0, and
// 0 without a token).
template <bool kSmoothed, bool kMinMax, class Emit>
__device__ __forceinline__ float combineKSlices(const SagePrologueParams &params, long long head, int tokens,
                                                Emit emit) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  float tensor_amax = 0.0f;
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    float mean = 0.0f;
    if constexpr (kSmoothed)
      mean = combinedMean(scratch.k_sum, first_entry, slices, tokens);
    emit(c, mean);
    if constexpr (kMinMax)
      if (tokens > 0)
        tensor_amax =
            fmaxf(tensor_amax, combinedAmax<kSmoothed>(scratch.k_min, scratch.k_max, first_entry, slices, mean));
  }
  return tensor_amax;
}

// mean(K) into shared memory for a K tile, and/or the per-tensor psi_K's amax over the whole sequence (returned; 0
// without one). In the two launches every K tile combines launch 1's slices itself and the first tile of a head
// (`store`) stores k_mean (quantizeKTile the per-tensor scale); in the one-pass launch the head's last statistics CTA
// has combined them once (combineKStatisticsOnce).
template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ float combineKStatistics(const SagePrologueParams &params, long long head,
                                                    [[maybe_unused]] int tokens, [[maybe_unused]] bool store,
                                                    [[maybe_unused]] float *channel_mean,
                                                    [[maybe_unused]] unsigned *amax_slot) {
  if constexpr (kOnePass) {
    awaitStatistics(params, head);
    const StatisticsScratch scratch = statisticsScratch(params);
    if constexpr (kSmoothed)
      for (int c = threadIdx.x; c < kHeadDim; c += kThreads)
        channel_mean[c] = __ldcg(scratch.k_mean + head * kHeadDim + c);
    __syncthreads();
    if constexpr (kMinMax)
      return __ldcg(scratch.k_amax + head * kHeadDim);
    else
      return 0.0f;
  } else {
    const float tensor_amax = combineKSlices<kSmoothed, kMinMax>(params, head, tokens, [&](int c, float mean) {
      if constexpr (kSmoothed) {
        channel_mean[c] = mean;
        if (store)
          workspaceFloats(params, params.offsets.k_mean)[head * kHeadDim + c] = mean;
      }
    });
    if constexpr (kMinMax) {
      return ctaMax(tensor_amax, amax_slot); // its barriers also publish channel_mean
    } else {
      __syncthreads();
      return tensor_amax;
    }
  }
}

// The one-pass launch: head `head`'s K statistics combined once, by its last statistics CTA (one_pass.cuh), into the
// scratch's k_mean / k_amax for the head's tiles, and into k_mean.
template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ void combineKStatisticsOnce(const SagePrologueParams &params, long long head,
                                                       [[maybe_unused]] unsigned *amax_slot) {
  const StatisticsScratch scratch = statisticsScratch(params);
  const float tensor_amax =
      combineKSlices<kSmoothed, kMinMax>(params, head, keyLength(params, head), [&](int c, float mean) {
        if constexpr (kSmoothed) {
          scratch.k_mean[head * kHeadDim + c] = mean;
          workspaceFloats(params, params.offsets.k_mean)[head * kHeadDim + c] = mean;
        }
      });
  if constexpr (kMinMax) {
    const float amax = ctaMax(tensor_amax, amax_slot);
    if (threadIdx.x == 0)
      scratch.k_amax[head * kHeadDim] = amax;
  }
}

} // namespace sage::device::prologue
