// Helpers that every kernel family shares (sm80, sm90, sm120, SLA): -inf without the standard library, and the
// reductions over the four lanes of a quad, which hold one row of an mma accumulator between them.
#pragma once

namespace sage::device {

__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000u); }

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 1));
  return fmaxf(value, __shfl_xor_sync(0xffffffffu, value, 2));
}

__device__ __forceinline__ float quad_sum(float value) {
  value += __shfl_xor_sync(0xffffffffu, value, 1);
  return value + __shfl_xor_sync(0xffffffffu, value, 2);
}

} // namespace sage::device
