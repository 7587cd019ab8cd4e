// Launch 1's results for launch 2 of the quantization prologue, in the workspace's prologue_statistics: where each
// lies. The generator pastes this header, then emits `statisticsScratch(params)`, which lays out the fields the
// variant has.
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

} // namespace sage::device::prologue
