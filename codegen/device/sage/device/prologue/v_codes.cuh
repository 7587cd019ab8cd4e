// The transposed V tile of the quantization prologue's per-channel psi_V: its shared-memory swizzle. The prologue
// generator pastes this header after its constants (kVectorElements, kVectorsPerRow), whose names it uses.
#pragma once

namespace sage::device::prologue {

// XOR-ing a word index with a multiple of 32 / kVectorsPerRow per 8-channel group keeps both the transposing writes
// and the row reads free of bank conflicts.
__device__ __forceinline__ int vTileSwizzle(int channel) {
  return channel / kVectorElements * (32 / kVectorsPerRow) % 32;
}

} // namespace sage::device::prologue
