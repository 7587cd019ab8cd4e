// Q smoothing's correction in the quantization prologue (the GEMV of sage.q_mean_correction), written by the K tiles
// (launch 2, after launch 1's q_mean). The prologue generator pastes this header after its constants, its tile
// library (TokenTile, rowSum) and its workspace helpers (kKTileTokens, kVectorElements, kLanesPerRow, kBlockQ,
// kHeadDim, workspaceFloats), whose names it uses.
#pragma once

namespace sage::device::prologue {

// delta_s [b, h_q, q_blocks, padded_kv] = q_mean[Q block] . x_K[token] for every Q head of this KV head (GQA) and
// every Q block, where x_K is what psi_K quantizes (`k`: K, or gamma(K) when K is smoothed): f32 products summed over
// this thread's 8 channels, then over the lanes of the row. Padded tokens get 0.
template <class KValues>
__device__ __forceinline__ void writeQMeanCorrection(const KValues &k, const SagePrologueParams &params, long long head,
                                                     int first, int stored_rows) {
  using Tile = TokenTile<kKTileTokens>;
  const int group = params.size.heads_q / params.size.heads_kv;
  const long long first_q_head =
      head / params.size.heads_kv * params.size.heads_q + head % params.size.heads_kv * group;
  const int q_blocks = params.size.padded_q / kBlockQ;
  const float *q_mean = workspaceFloats(params, params.offsets.q_mean);
  float *delta_s = workspaceFloats(params, params.offsets.delta_s);
  for (long long block = first_q_head * q_blocks; block < (first_q_head + group) * q_blocks; ++block) {
    float mean[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      mean[j] = q_mean[block * kHeadDim + Tile::channel() + j];
    float *delta = delta_s + block * params.size.padded_kv + first;
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        sum = __fmaf_rn(mean[j], k(pass, j), sum);
      sum = rowSum(sum); // every lane takes part in the shuffles
      if (Tile::inTile(pass) && Tile::row(pass) < stored_rows && laneInRow() == 0)
        delta[Tile::row(pass)] = sum;
    }
  }
}

} // namespace sage::device::prologue
