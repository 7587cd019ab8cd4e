// The quantization prologue's token tiles: kTileTokens x kHeadDim inputs spread over the CTA, kept in registers. The
// generator pastes this header after its constants (kHeadDim, kVectorElements, kVectorsPerRow, kRowsPerPass) and
// global_memory.cuh (loadVector, elementOf), whose names it uses.
#pragma once

namespace sage::device::prologue {

// Thread t holds the 8-channel vector t % kVectorsPerRow of rows t / kVectorsPerRow + pass * kRowsPerPass: the
// kVectorsPerRow lanes of a row are neighbours in one warp, so a row reduces with shuffles.
template <int kTileTokens> struct TokenTile {
  static constexpr int kPasses = (kTileTokens + kRowsPerPass - 1) / kRowsPerPass;
  uint4 raw[kPasses]; // as loaded; zero past the sequence

  static __device__ __forceinline__ int row(int pass) {
    return pass * kRowsPerPass + (int)threadIdx.x / kVectorsPerRow;
  }
  static __device__ __forceinline__ int channel() { return (int)threadIdx.x % kVectorsPerRow * kVectorElements; }
  static __device__ __forceinline__ bool inTile(int pass) {
    return kTileTokens % kRowsPerPass == 0 || row(pass) < kTileTokens;
  }

  // Rows [0, valid_rows) from `first_row`; every load is issued before any is used.
  __device__ __forceinline__ void load(const unsigned short *first_row, long long token_stride, int valid_rows) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      raw[pass] =
          row(pass) < valid_rows ? loadVector(first_row + row(pass) * token_stride + channel()) : uint4{0u, 0u, 0u, 0u};
  }
  __device__ __forceinline__ float element(int pass, int j) const { return elementOf(raw[pass], j); }
};

} // namespace sage::device::prologue
