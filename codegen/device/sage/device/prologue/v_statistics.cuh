// The statistics of V over the whole sequence for the quantization prologue's V roles (launch 2), combined from
// launch 1's slices in slice order: mean(V) when V is smoothed, the per-channel scales of psi_V when V is quantized
// (VQuantizer, the generated psi_V: kCodeMax). The prologue generator pastes this header after its constants, its
// statistics scratch (statisticsScratch), geometry.cuh, scalar_helpers.cuh, the input header and global_memory.cuh,
// whose names it uses.
#pragma once

namespace sage::device::prologue {

// Every V tile computes the same values; tile 0 stores them (v_mean, v_scales).
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatistics(const SagePrologueParams &params, long long head,
                                                   [[maybe_unused]] bool store, [[maybe_unused]] float *channel_mean,
                                                   [[maybe_unused]] float *channel_inverse) {
  if constexpr (kOnePass) {
    // The head's last statistics CTA has combined them (combineVStatisticsOnce) and stored v_mean and v_scales.
    awaitStatistics(params, head);
    const StatisticsScratch scratch = statisticsScratch(params);
    for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
      if constexpr (kSmoothed)
        channel_mean[c] = __ldcg(scratch.v_mean + head * kHeadDim + c);
      if constexpr (kCodes)
        channel_inverse[c] = __ldcg(scratch.v_inverse + head * kHeadDim + c);
    }
    __syncthreads();
    return;
  }
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    [[maybe_unused]] float mean = 0.0f;
    if constexpr (kSmoothed) {
      mean = combinedMean(scratch.v_sum, first_entry, slices, params.size.tokens_kv);
      channel_mean[c] = mean;
      if (store)
        workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
    }
    if constexpr (kCodes) { // max |V - mean(V)| or max |V|
      const float amax = combinedAmax<kSmoothed>(scratch.v_min, scratch.v_max, first_entry, slices, mean);
      const SymmetricScale scale = symmetricScale(amax, VQuantizer::kCodeMax);
      channel_inverse[c] = scale.inverse;
      if (store)
        workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
    }
  }
  __syncthreads();
}

// The one-pass launch: head `head`'s V statistics combined once, by its last statistics CTA (one_pass.cuh), as
// combineVStatistics combines them, into the scratch's v_mean / v_inverse for the head's tiles, v_mean and
// v_scales.
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatisticsOnce(const SagePrologueParams &params, long long head) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    [[maybe_unused]] float mean = 0.0f;
    if constexpr (kSmoothed) {
      mean = combinedMean(scratch.v_sum, first_entry, slices, params.size.tokens_kv);
      scratch.v_mean[head * kHeadDim + c] = mean;
      workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
    }
    if constexpr (kCodes) {
      const float amax = combinedAmax<kSmoothed>(scratch.v_min, scratch.v_max, first_entry, slices, mean);
      const SymmetricScale scale = symmetricScale(amax, VQuantizer::kCodeMax);
      scratch.v_inverse[head * kHeadDim + c] = scale.inverse;
      workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
    }
  }
}

// mean(V) for convertVTileOf (v_convert.cuh) when V is smoothed.
struct SmoothedVMean {
  static constexpr bool kSmoothed = true;
  static __device__ __forceinline__ void combine(const SagePrologueParams &params, long long head, bool store,
                                                 float *channel_mean) {
    combineVStatistics<true, false>(params, head, store, channel_mean, nullptr);
  }
};

} // namespace sage::device::prologue
