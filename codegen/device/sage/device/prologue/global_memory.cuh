// The quantization prologue's global memory: 16-byte vectors of 8 input elements, read through the read-only path,
// and the workspace (sequences.cuh finds the caller's rows). The generator pastes this header after KernelAbi.h and the
// input header (inputToFloat, extremeOfPairs), whose names it uses.
#pragma once

namespace sage::device::prologue {

__device__ __forceinline__ uint4 loadVector(const unsigned short *address) {
  uint4 words;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(words.x), "=r"(words.y), "=r"(words.z), "=r"(words.w)
      : "l"(address));
  return words;
}

// Element j of a vector as f32 (j is a constant once loops are unrolled).
__device__ __forceinline__ float elementOf(const uint4 &words, int j) {
  const unsigned word = j < 2 ? words.x : j < 4 ? words.y : j < 6 ? words.z : words.w;
  return inputToFloat(j % 2 == 0 ? word & 0xffffu : word >> 16);
}

// The largest |element| of a vector, as f32 (exact); a NaN never wins, as with fmaxf. Three pair maxima on the
// magnitudes instead of eight conversions and eight f32 maxima.
__device__ __forceinline__ float maxMagnitudeOf(const uint4 &words) {
  const unsigned low = extremeOfPairs<true>(words.x & 0x7fff7fffu, words.y & 0x7fff7fffu);
  const unsigned high = extremeOfPairs<true>(words.z & 0x7fff7fffu, words.w & 0x7fff7fffu);
  const unsigned both = extremeOfPairs<true>(low, high);
  return fmaxf(fmaxf(0.0f, inputToFloat(both & 0xffffu)), inputToFloat(both >> 16)); // 0 when both are NaN
}

// The word the attention kernel after this prologue needs zeroed (SagePrologueParams::cleared_word_offset): written
// by one thread of CTA 0; the kernel that reads it starts after this launch ends, in stream order.
__device__ __forceinline__ void clearLaunchWord(const SagePrologueParams &params) {
  if (params.cleared_word_offset != SAGE_NO_CLEARED_WORD && blockIdx.x == 0 && threadIdx.x == 0)
    *(unsigned *)(params.workspace + params.cleared_word_offset) = 0u;
}

__device__ __forceinline__ float *workspaceFloats(const SagePrologueParams &params, unsigned long long offset) {
  return (float *)(params.workspace + offset);
}

} // namespace sage::device::prologue
