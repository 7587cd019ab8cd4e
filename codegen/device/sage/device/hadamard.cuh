// The fast Walsh-Hadamard transform x <- x H of one token's d = 2^n f32 values spread over a warp, bit for bit the
// butterflies of sage/numerics/Hadamard.h (strides 1, 2, 4, ... in that order, one f32 rounding per add), and the
// sign-and-scale step around it. Shared by the quantization prologue's rotation (prologue/rotation.cuh: x R = (x H)
// D 2^-e) and SageBwd's (sm80/backward_rotation.cuh: the same on Q and K, and dQ R_K^-1 = (dQ D 2^-e_Q) H on the way
// out), so that every rotation the kernels apply is the one the CPU reference computes.
#pragma once

namespace sage::device {

// x H of a row whose channels lie kElements to a lane on kLanes consecutive lanes of one warp (lane_in_row = the lane
// index within the row's lanes, channels kElements lane_in_row ..): strides below kElements inside the thread, then
// kElements, 2 kElements, ... across lanes by __shfl_xor_sync. At each stride the lower channel gets a + b and the
// upper one a - b (the lane holding the upper one subtracts its own value from its partner's). Every lane of the warp
// calls it (the shuffles take the full warp).
template <int kElements, int kLanes>
__device__ __forceinline__ void walsh_hadamard_row(float (&x)[kElements], int lane_in_row) {
  static_assert((kElements & (kElements - 1)) == 0 && (kLanes & (kLanes - 1)) == 0 && kLanes <= 32,
                "a row is a power of two of lanes holding a power of two of channels each");
#pragma unroll
  for (int stride = 1; stride < kElements; stride *= 2)
#pragma unroll
    for (int j = 0; j < kElements; ++j)
      if ((j & stride) == 0) {
        const float a = x[j], b = x[j + stride];
        x[j] = __fadd_rn(a, b);
        x[j + stride] = __fsub_rn(a, b);
      }
#pragma unroll
  for (int lanes = 1; lanes < kLanes; lanes *= 2) {
    const bool upper = (lane_in_row & lanes) != 0;
#pragma unroll
    for (int j = 0; j < kElements; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, x[j], lanes);
      x[j] = upper ? __fsub_rn(other, x[j]) : __fadd_rn(x[j], other);
    }
  }
}

// x[j] * (+-scale): the signs D (bit j of `signs` set negates element j) and the power of two 2^-e in one exact
// multiply (unless the product is subnormal).
template <int kElements>
__device__ __forceinline__ void apply_signs(float (&x)[kElements], unsigned signs, float scale) {
#pragma unroll
  for (int j = 0; j < kElements; ++j)
    x[j] = __fmul_rn(x[j], (signs >> j & 1u) != 0 ? -scale : scale);
}

} // namespace sage::device
