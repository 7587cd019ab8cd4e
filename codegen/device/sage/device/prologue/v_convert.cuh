// The quantization prologue's V role for an f16 P.V: V (minus mean(V) with V smoothing, one f32 subtraction) rounded
// to f16 into v_values [b, h_kv, padded_kv, d] (padded rows 0). VMean is NoVMean, or SmoothedVMean of
// v_statistics.cuh. The prologue generator pastes this header after its constants, scalar_helpers.cuh,
// token_tile.cuh and v_tile.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// V is not smoothed: nothing to combine.
struct NoVMean {
  static constexpr bool kSmoothed = false;
};

template <class VMean>
__device__ __forceinline__ void convertVTileOf(const SagePrologueParams &params, long long cta,
                                               [[maybe_unused]] unsigned char *shared) {
  using Tile = TokenTile<kVTileTokens>;
  const VTileTask v_tile = vTileTask(params, cta);
  const int stored_rows = min(kVTileTokens, params.size.padded_kv - v_tile.first);
  Tile values;
  values.load(v_tile.v, v_tile.token_stride, v_tile.valid_rows);
  const int channel = Tile::channel();
  [[maybe_unused]] float mean[kVectorElements];
  if constexpr (VMean::kSmoothed) {
    float *channel_mean = (float *)shared;
    VMean::combine(params, v_tile.head, v_tile.length, v_tile.tile == 0, channel_mean);
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      mean[j] = channel_mean[channel + j];
  }
  unsigned short *out = (unsigned short *)(params.workspace + params.offsets.v_values) +
                        (v_tile.head * params.size.padded_kv + v_tile.first) * kHeadDim;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    const int row = Tile::row(pass);
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    unsigned words[4];
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
      float x[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        if constexpr (VMean::kSmoothed)
          x[half] = row < v_tile.valid_rows ? __fsub_rn(values.element(pass, j), mean[j]) : 0.0f;
        else
          x[half] = values.element(pass, j);
      }
      words[pair] = (unsigned)floatToHalfBits(x[0]) | (unsigned)floatToHalfBits(x[1]) << 16;
    }
    *(uint4 *)(out + (long long)row * kHeadDim + channel) = uint4{words[0], words[1], words[2], words[3]};
  }
}

} // namespace sage::device::prologue
