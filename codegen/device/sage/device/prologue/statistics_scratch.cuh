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
  // The one-pass launch's statistics of each KV head, combined once by its last statistics CTA (one_pass.cuh) for
  // its tiles: mean(K), the per-tensor psi_K's amax (entry 0), mean(V), psi_V's per-channel inverse scales
  // ([batch * heads_kv][kHeadDim] each; the workspace holds one slice more than the slices for them).
  float *k_mean, *k_amax, *v_mean, *v_inverse;
};

// One channel's statistics over the whole sequence, from its entries of launch 1's slices (`first_entry`,
// `first_entry + kHeadDim`, ...) combined in slice order. The mean: the slices' sums added in order, one f32 division;
// 0 for a sequence of no tokens (an empty packed sequence).
// Read through L2 (ld.global.cg): in the one-pass prologue other CTAs wrote them during this launch.
__device__ __forceinline__ float combinedMean(const float *sums, long long first_entry, int slices, int tokens) {
  float sum = 0.0f;
  for (int slice = 0; slice < slices; ++slice)
    sum = __fadd_rn(sum, __ldcg(sums + first_entry + slice * kHeadDim));
  return tokens > 0 ? __fdiv_rn(sum, (float)tokens) : 0.0f;
}

// The amax of x - mean (kCentred: x -> x - mean is monotonic in f32, so the minimum and maximum bound every token),
// or of x. A sequence of no tokens has only the identities (+inf, -inf) in its slices: callers take 0 for it.
template <bool kCentred>
__device__ __forceinline__ float combinedAmax(const unsigned short *minima, const unsigned short *maxima,
                                              long long first_entry, int slices, [[maybe_unused]] float mean) {
  float low = positiveInfinity(), high = -positiveInfinity();
  for (int slice = 0; slice < slices; ++slice) {
    low = fminf(low, inputToFloat(__ldcg(minima + first_entry + slice * kHeadDim)));
    high = fmaxf(high, inputToFloat(__ldcg(maxima + first_entry + slice * kHeadDim)));
  }
  if constexpr (kCentred)
    return fmaxf(fabsf(__fsub_rn(high, mean)), fabsf(__fsub_rn(low, mean)));
  else
    return fmaxf(fabsf(high), fabsf(low));
}

} // namespace sage::device::prologue
