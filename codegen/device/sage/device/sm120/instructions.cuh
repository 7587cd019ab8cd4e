// The PTX instructions of the sm120 FP4 kernel: the block-scaled mma.sync, the e2m1/ue4m3/ue8m0 conversions and
// cp.async. Every spelling here was assembled by ptxas 13.0 for sm_120a/sm_120f/sm_121a (sm_100a/sm_100f/sm_103a
// reject the block-scaled mma.sync: "mma with block scale not supported").
#pragma once

namespace sage::device::sm120 {

// D += (A x scale_A) . (B x scale_B), NVFP4: e2m1 operands, one UE4M3 scale per 16 elements of k (scale_vec::4X,
// the four bytes of a scale register are k groups 0..3). Selectors {byte 0, thread 0}: every lane holds its row's
// (column's) scales, so whichever lanes the selector reads hold the right ones.
__device__ __forceinline__ void mma_nvfp4(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                          unsigned scale_a, unsigned scale_b) {
  asm volatile("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(scale_a), "r"(scale_b));
}

// The same with MXFP4's UE8M0 scales, one per 32 elements of k (scale_vec::2X: bytes 0 and 1 of the register).
__device__ __forceinline__ void mma_mxfp4(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                          unsigned scale_a, unsigned scale_b) {
  asm volatile("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}, %10, {0, 0}, %11, {0, 0};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(scale_a), "r"(scale_b));
}

// Two f32 -> one byte of two e2m1 codes (round to nearest even, saturating at +-6); `low` in bits 0-3, as
// numerics::floatToE2m1Bits and the workspace's codes (element 2k in the low nibble of byte k).
__device__ __forceinline__ unsigned pack_e2m1x2(float low, float high) {
  unsigned packed;
  asm("{\n"
      "  .reg .b8 pair;\n"
      "  cvt.rn.satfinite.e2m1x2.f32 pair, %1, %2;\n"
      "  cvt.u32.u8 %0, pair;\n"
      "}\n"
      : "=r"(packed)
      : "f"(high), "f"(low));
  return packed;
}

// A non-negative f32 -> its UE4M3 code (cvt.rn.satfinite.e4m3x2: round to nearest even, saturating at 448; +0 -> 0),
// numerics::floatToUe4m3Bits for the values a microscale can take.
__device__ __forceinline__ unsigned ue4m3_code(float value) {
  unsigned short pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, 0f00000000, %1;\n" : "=h"(pair) : "f"(value));
  return pair & 0xffu;
}

// A UE4M3 code -> its value (exact, through f16).
__device__ __forceinline__ float ue4m3_value(unsigned code) {
  unsigned halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(static_cast<unsigned short>(code)));
  float value;
  asm("{\n"
      "  .reg .f16 low, high;\n"
      "  mov.b32 {low, high}, %1;\n"
      "  cvt.f32.f16 %0, low;\n"
      "}\n"
      : "=f"(value)
      : "r"(halves));
  return value;
}

// ---- cp.async (the K/V pipeline) ----
__device__ __forceinline__ unsigned shared_address(const void *pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

template <int kBytes> __device__ __forceinline__ void cp_async(void *shared, const void *global) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(shared)), "l"(global) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(shared_address(shared)), "l"(global), "n"(kBytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

} // namespace sage::device::sm120
