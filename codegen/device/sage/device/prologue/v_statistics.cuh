// The statistics of V over the whole sequence for the quantization prologue's V roles (launch 2), combined from
// launch 1's slices in slice order: mean(V) when V is smoothed, the per-channel scales of psi_V when V is quantized
// (VQuantizer, the generated psi_V: kCodeMax). The prologue generator pastes this header after its constants, its
// statistics scratch (statisticsScratch), geometry.cuh, scalar_helpers.cuh, the input header, global_memory.cuh and
// sequences.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// Channel by channel (this thread's channels), mean(V) over the head's `tokens` (its slot's sequence; the slices' sums
// in slice order, one f32 division; 0 when V is not smoothed or has no token) and psi_V's scale from the slices'
// minima and maxima (kCodes; scale and inverse 0 without a token, so codes 0), handed to emit(c, mean, scale).
template <bool kSmoothed, bool kCodes, class VQuantizer, class Emit>
__device__ __forceinline__ void combineVSlices(const SagePrologueParams &params, long long head, int tokens,
                                               Emit emit) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
    float mean = 0.0f;
    if constexpr (kSmoothed)
      mean = combinedMean(scratch.v_sum, first_entry, slices, tokens);
    SymmetricScale scale = {0.0f, 0.0f};
    if constexpr (kCodes) // max |V - mean(V)| or max |V|
      if (tokens > 0)
        scale = symmetricScale(combinedAmax<kSmoothed>(scratch.v_min, scratch.v_max, first_entry, slices, mean),
                               VQuantizer::kCodeMax);
    emit(c, mean, scale);
  }
}

// mean(V) and/or psi_V's per-channel inverse scales into shared memory for a V tile. In the two launches every V tile
// combines launch 1's slices itself and tile 0 (`store`) stores v_mean and v_scales; in the one-pass launch the
// head's last statistics CTA has combined them once (combineVStatisticsOnce).
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatistics(const SagePrologueParams &params, long long head,
                                                   [[maybe_unused]] int tokens, [[maybe_unused]] bool store,
                                                   [[maybe_unused]] float *channel_mean,
                                                   [[maybe_unused]] float *channel_inverse) {
  if constexpr (kOnePass) {
    awaitStatistics(params, head);
    const StatisticsScratch scratch = statisticsScratch(params);
    for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
      if constexpr (kSmoothed)
        channel_mean[c] = __ldcg(scratch.v_mean + head * kHeadDim + c);
      if constexpr (kCodes)
        channel_inverse[c] = __ldcg(scratch.v_inverse + head * kHeadDim + c);
    }
  } else {
    combineVSlices<kSmoothed, kCodes, VQuantizer>(params, head, tokens, [&](int c, float mean, SymmetricScale scale) {
      if constexpr (kSmoothed) {
        channel_mean[c] = mean;
        if (store)
          workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
      }
      if constexpr (kCodes) {
        channel_inverse[c] = scale.inverse;
        if (store)
          workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
      }
    });
  }
  __syncthreads();
}

// The one-pass launch: head `head`'s V statistics combined once, by its last statistics CTA (one_pass.cuh), into the
// scratch's v_mean / v_inverse for the head's tiles, and into v_mean and v_scales.
template <bool kSmoothed, bool kCodes, class VQuantizer = void>
__device__ __forceinline__ void combineVStatisticsOnce(const SagePrologueParams &params, long long head) {
  const StatisticsScratch scratch = statisticsScratch(params);
  const int tokens = keyLength(params, head);
  combineVSlices<kSmoothed, kCodes, VQuantizer>(params, head, tokens, [&](int c, float mean, SymmetricScale scale) {
    if constexpr (kSmoothed) {
      scratch.v_mean[head * kHeadDim + c] = mean;
      workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
    }
    if constexpr (kCodes) {
      scratch.v_inverse[head * kHeadDim + c] = scale.inverse;
      workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
    }
  });
}

// mean(V) for convertVTileOf (v_convert.cuh) when V is smoothed.
struct SmoothedVMean {
  static constexpr bool kSmoothed = true;
  static __device__ __forceinline__ void combine(const SagePrologueParams &params, long long head, int tokens,
                                                 bool store, float *channel_mean) {
    combineVStatistics<true, false>(params, head, tokens, store, channel_mean, nullptr);
  }
};

} // namespace sage::device::prologue
