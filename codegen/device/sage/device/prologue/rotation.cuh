// The quantization prologue's randomized Hadamard rotation of Q's and K's tokens before psi (issue 28), bit for bit as
// sage/numerics/Hadamard.h defines it, so that the codes equal the CPU reference's. The generator pastes this header,
// for a rotated variant only, after its constants (kVectorElements, kVectorsPerRow), token_tile.cuh and the rotation's
// constants (kRotationSigns0..3: bit c of word c / 64 negates channel c; kRotationScaleQ, kRotationScaleK: the powers
// of two 2^-e), whose names it uses.
#pragma once

#include "sage/device/hadamard.cuh"

namespace sage::device::prologue {

// A tile's rotated x, in registers: what psi quantizes instead of the tile's own values.
template <int kTileTokens> struct RotatedTile {
  float value[TokenTile<kTileTokens>::kPasses][kVectorElements];
  __device__ __forceinline__ float operator()(int pass, int j) const { return value[pass][j]; }
};

// The sign bits of this thread's 8 channels (a multiple of 8 never straddles a 64-bit word).
__device__ __forceinline__ unsigned rotationSignBits(int channel) {
  const unsigned long long word = channel < 64    ? kRotationSigns0
                                  : channel < 128 ? kRotationSigns1
                                  : channel < 192 ? kRotationSigns2
                                                  : kRotationSigns3;
  return (unsigned)(word >> (channel % 64)) & 0xffu;
}

// x R_Q (kForK false) or x R_K of every row of a tile: the fast Walsh-Hadamard transform over the row's kVectorsPerRow
// lanes (hadamard.cuh's walsh_hadamard_row: strides 1, 2, 4 inside the thread's 8 channels, then 8, 16, ... across
// lanes), then one multiply by +-2^-e. Every thread of the CTA calls it (the shuffles take the full warp); rows past
// the sequence hold x = 0 and stay 0.
template <int kTileTokens, bool kForK, class Values>
__device__ __forceinline__ RotatedTile<kTileTokens> rotateTile(const Values &values) {
  using Tile = TokenTile<kTileTokens>;
  static_assert(kLanesPerRow == kVectorsPerRow, "a rotated row is a power of two of vectors (prologueRotationSupport)");
  const int lane_in_row = (int)threadIdx.x % kVectorsPerRow;
  const unsigned signs = rotationSignBits(Tile::channel());
  const float scale = kForK ? kRotationScaleK : kRotationScaleQ;
  RotatedTile<kTileTokens> rotated;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    float x[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      x[j] = values(pass, j);
    walsh_hadamard_row<kVectorElements, kVectorsPerRow>(x, lane_in_row);
    apply_signs(x, signs, scale);
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      rotated.value[pass][j] = x[j];
  }
  return rotated;
}

} // namespace sage::device::prologue
