// The K tile of the quantization prologue's psi_K role: kKBlocksPerTile KV blocks of K in registers, and the x that
// psi_K quantizes. The prologue generator pastes this header after its tile library (TokenTile, kKTileTokens,
// kVectorElements), whose names it uses, and names the variant's tile: `using KTile = KTileOf<smoothed K>`.
#pragma once

namespace sage::device::prologue {

// K itself; rows past the sequence are 0.
template <bool kSmoothed> struct KTileOf {
  TokenTile<kKTileTokens> tile;
  __device__ __forceinline__ float operator()(int pass, int j) const { return tile.element(pass, j); }
};

// gamma(K) = K - mean(K), the smoothing of paper 4.2 (one f32 subtraction, mean(K) over the whole sequence, combined
// from launch 1's slices). Rows past the sequence are 0.
template <> struct KTileOf<true> {
  TokenTile<kKTileTokens> tile;
  int valid_rows;              // tokens of this tile inside the sequence
  float mean[kVectorElements]; // mean(K) of this thread's channels

  __device__ __forceinline__ float operator()(int pass, int j) const {
    return TokenTile<kKTileTokens>::row(pass) < valid_rows ? __fsub_rn(tile.element(pass, j), mean[j]) : 0.0f;
  }
};

} // namespace sage::device::prologue
