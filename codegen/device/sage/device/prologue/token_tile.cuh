// The quantization prologue's token tiles: kTileTokens x kHeadDim inputs spread over the CTA, kept in registers. The
// generator pastes this header after its constants (kHeadDim, kVectorElements, kVectorsPerRow, kLanesPerRow,
// kRowsPerPass) and global_memory.cuh (loadVector, elementOf), whose names it uses.
#pragma once

namespace sage::device::prologue {

// A token row is kLanesPerRow neighbouring lanes of one warp (kVectorsPerRow rounded up to a power of two): lane l of
// the group holds the row's 8-channel vector l. Where d / 8 is not a power of two (d = 80, 96, 160, 192) the group's
// last lanes hold no vector: they load nothing, read channel 0's per-channel values (so that every index stays in
// range), contribute the identity to every row and column reduction, and store nothing.
__device__ __forceinline__ int laneInRow() { return (int)threadIdx.x % kLanesPerRow; }
__device__ __forceinline__ bool laneHoldsVector() {
  return kLanesPerRow == kVectorsPerRow || laneInRow() < kVectorsPerRow;
}
__device__ __forceinline__ int channelOfLane() { return laneHoldsVector() ? laneInRow() * kVectorElements : 0; }

// Thread t holds vector laneInRow() of rows t / kLanesPerRow + pass * kRowsPerPass: the lanes of a row are
// neighbours in one warp, so a row reduces with shuffles.
template <int kTileTokens> struct TokenTile {
  static constexpr int kPasses = (kTileTokens + kRowsPerPass - 1) / kRowsPerPass;
  uint4 raw[kPasses]; // as loaded; zero past the sequence (and in lanes that hold no vector)

  static __device__ __forceinline__ int row(int pass) { return pass * kRowsPerPass + (int)threadIdx.x / kLanesPerRow; }
  static __device__ __forceinline__ int channel() { return channelOfLane(); }
  // This thread holds a vector of a row of the tile: false past the tile and in lanes that hold no vector, which
  // guards every store and every per-row fold.
  static __device__ __forceinline__ bool inTile(int pass) {
    return laneHoldsVector() && (kTileTokens % kRowsPerPass == 0 || row(pass) < kTileTokens);
  }

  // Rows [0, valid_rows) from `first_row`; every load is issued before any is used.
  __device__ __forceinline__ void load(const unsigned short *first_row, long long token_stride, int valid_rows) {
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass)
      raw[pass] = row(pass) < valid_rows && laneHoldsVector()
                      ? loadVector(first_row + row(pass) * token_stride + channel())
                      : uint4{0u, 0u, 0u, 0u};
  }
  __device__ __forceinline__ float element(int pass, int j) const { return elementOf(raw[pass], j); }
};

} // namespace sage::device::prologue
