// The quantization prologue's randomized Hadamard rotation of Q's and K's tokens before psi (issue 28), bit for bit as
// sage/numerics/Hadamard.h defines it, so that the codes equal the CPU reference's. The generator pastes this header,
// for a rotated variant only, after its constants (kVectorElements, kVectorsPerRow), token_tile.cuh and the rotation's
// constants (kRotationSigns0..3: bit c of word c / 64 negates channel c; kRotationScaleQ, kRotationScaleK: the powers
// of two 2^-e), whose names it uses.
#pragma once

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

// x R_Q (kForK false) or x R_K of every row of a tile: the fast Walsh-Hadamard transform's strides 1, 2, 4 inside the
// thread's 8 channels, then 8, 16, ... across the row's kVectorsPerRow lanes (neighbours in one warp), in that order;
// at each stride the lower channel gets a + b and the upper a - b (the lane holding the upper one subtracts its own
// value from its partner's); then one multiply by +-2^-e. Every thread of the CTA calls it (the shuffles take the full
// warp); rows past the sequence hold x = 0 and stay 0.
template <int kTileTokens, bool kForK, class Values>
__device__ __forceinline__ RotatedTile<kTileTokens> rotateTile(const Values &values) {
  using Tile = TokenTile<kTileTokens>;
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
#pragma unroll
    for (int stride = 1; stride < kVectorElements; stride *= 2)
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        if ((j & stride) == 0) {
          const float a = x[j], b = x[j + stride];
          x[j] = __fadd_rn(a, b);
          x[j + stride] = __fsub_rn(a, b);
        }
#pragma unroll
    for (int lanes = 1; lanes < kVectorsPerRow; lanes *= 2) {
      const bool upper = (lane_in_row & lanes) != 0;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, x[j], lanes);
        x[j] = upper ? __fsub_rn(other, x[j]) : __fadd_rn(x[j], other);
      }
    }
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      rotated.value[pass][j] = __fmul_rn(x[j], (signs >> j & 1u) != 0 ? -scale : scale);
  }
  return rotated;
}

} // namespace sage::device::prologue
