// What both mask GEMM kernels share (sla/mask_gemm.cuh: mma.sync; sla/mask_gemm_sm90.cuh: wgmma): the operands, the
// class bytes of A's rows, and A's exact power-of-two factors (mask_gemm.cuh's header says why they are exact).
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

constexpr int kMaskGemmMaxReference = 15; // the largest entry of A is 2^15

// One mask GEMM: out[r] = sum over k < depth of [class(r, k) == marginal] s_k S_k, S_k the f16 matrix of summed
// block k (d x d, with its power-of-two scale s_k). The forward's rows are q blocks and its summed blocks kv blocks
// (h_j); the backward's rows are kv blocks and its summed blocks the q blocks of every q head of the GQA group (dH_i).
struct MaskGemmOperands {
  const signed char *classes; // class(r, k) at classes[r * row_stride + k * depth_stride]
  long long row_stride, depth_stride;
  const unsigned short *states; // S_k at states + k d^2
  const float *scales;          // s_k at scales[k]
  float *out;                   // out[r] at out + r d^2 (f32)
  int *fallback;                // [rows]
  int rows, depth;
};

// The classes of 16 consecutive summed blocks of one row (1: critical, 0: marginal, -1: negligible), one byte each in
// four words (block first + n is byte n % 4 of word n / 4); past the end they read as critical (A = 0 there).
struct ClassRun {
  unsigned word[4];
  __device__ bool marginal(int n) const { return ((word[n / 4] >> (8 * (n % 4))) & 0xffu) == 0; }
};

__device__ __forceinline__ ClassRun load_classes(const MaskGemmOperands &o, int row, int first) {
  ClassRun run;
  const signed char *at = o.classes + row * o.row_stride + first * o.depth_stride;
  if (o.depth_stride == 1 && first + 16 <= o.depth && (reinterpret_cast<unsigned long long>(at) & 15) == 0) {
    const uint4 bits = __ldg(reinterpret_cast<const uint4 *>(at));
    run.word[0] = bits.x, run.word[1] = bits.y, run.word[2] = bits.z, run.word[3] = bits.w;
  } else {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      run.word[w] = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = 4 * w + e;
        run.word[w] |= (first + n < o.depth ? static_cast<unsigned char>(at[n * o.depth_stride]) : 1u) << (8 * e);
      }
    }
  }
  return run;
}

// f16 bits of s_k / reference (powers of two: exact down to 2^-24), or 0 below that.
__device__ __forceinline__ unsigned short gemm_factor(float scale, float reference) {
  const float factor = scale / reference;
  return factor >= 1.0f / 16777216.0f ? f16_bits(factor) : 0;
}

} // namespace sage::device::sla
