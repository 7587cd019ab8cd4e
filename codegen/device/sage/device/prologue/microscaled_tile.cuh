// FP4 (microscaled) Q and K tiles of the quantization prologue: the e2m1 codes and scales of a tile's rows. The
// prologue generator pastes this header after its constants, its tile library (TokenTile, kVectorElements, kHeadDim)
// and the device library's fp4/microscaling.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// FP4 along the channels of each token: a thread holds 8 channels of a row, so a group of Quantizer::kGroupChannels
// channels is kGroupChannels / 8 neighbouring lanes; its amax is their max (shuffles), its scale byte is stored by
// the group's first lane. Codes: 4 bytes (8 nibbles) per thread and row; rows past `stored_rows` are not stored.
template <class Quantizer, class Values>
__device__ __forceinline__ void storeMicroscaledTile(const Values &values, unsigned char *codes, unsigned char *scales,
                                                     int stored_rows) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    float x[kVectorElements];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j) {
      x[j] = values(pass, j);
      amax = sage::device::fp4::max_magnitude(amax, x[j]);
    }
#pragma unroll
    for (int offset = 1; offset < Quantizer::kGroupChannels / kVectorElements; offset *= 2)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset)); // every lane takes part
    const unsigned scale = Quantizer::scaleCode(amax);
    const int row = Tile::row(pass), channel = Tile::channel();
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    *(unsigned *)(codes + (long long)row * (kHeadDim / 2) + channel / 2) =
        sage::device::fp4::pack_e2m1x8(x, Quantizer::inverse(scale));
    if (channel % Quantizer::kGroupChannels == 0)
      scales[(long long)row * (kHeadDim / Quantizer::kGroupChannels) + channel / Quantizer::kGroupChannels] =
          (unsigned char)scale;
  }
}

} // namespace sage::device::prologue
