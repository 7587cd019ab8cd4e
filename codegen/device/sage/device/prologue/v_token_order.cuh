// v_codes' token axis in the token order of the Hopper wgmma P.V (WorkspaceLayout.h), for the quantization
// prologue's per-channel psi_V: the generator pastes this header only when the variant's v_codes are interleaved.
#pragma once

namespace sage::device::prologue {

// Position p of each 32-token group holds this token, so that an 8-bit A fragment (k = 4q + {0..3}, 16 + 4q +
// {0..3}) matches the S accumulator columns (8j + 2q + {0, 1}) its thread already holds.
__device__ __forceinline__ int vTokenAtPosition(int position) {
  const int p = position % 32;
  return position - p + 16 * (p / 16) + 8 * (p % 4 / 2) + 2 * (p % 16 / 4) + p % 2;
}

// The TokenOrder of quantizeVTileOf (v_quantize.cuh) for these v_codes.
struct WgmmaTokenOrder {
  static __device__ __forceinline__ int token(int position) { return vTokenAtPosition(position); }
};

} // namespace sage::device::prologue
