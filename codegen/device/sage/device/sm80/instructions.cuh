// The PTX instructions of the sm80 (mma.sync) attention kernel: the mma.sync shapes its Q.K^T and P.V products use,
// ldmatrix and cp.async. Each wrapper is one inline-PTX instruction; fragments are 32-bit registers (`unsigned` for
// packed 8/16-bit values, `int`/`float`/`unsigned` f16x2 accumulators), C and D share registers. The operand layouts
// are the PTX ISA's tables, modelled on the host by sage/codegen/FragmentLayout.h.
#pragma once

namespace sage::device::sm80 {

// ---- mma.sync: accumulator += a . b (A row-major, B column-major) ----
// s8 x s8, s32 accumulator (int8 Q.K^T, int8 P.V per block)
__device__ __forceinline__ void mma_m16n8k32_s8_s32(int (&accumulator)[4], const unsigned (&a)[4], unsigned b0,
                                                    unsigned b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+r"(accumulator[0]), "+r"(accumulator[1]), "+r"(accumulator[2]), "+r"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 x e4m3, f32 accumulator (sm_89 and newer)
__device__ __forceinline__ void mma_m16n8k32_e4m3_f32(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0,
                                                      unsigned b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f16 x f16, f16 accumulator: two f16x2 registers
__device__ __forceinline__ void mma_m16n8k16_f16_f16(unsigned (&accumulator)[2], const unsigned (&a)[4], unsigned b0,
                                                     unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\n"
      : "+r"(accumulator[0]), "+r"(accumulator[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// f16 x f16, f32 accumulator
__device__ __forceinline__ void mma_m16n8k16_f16_f32(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0,
                                                     unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16 x bf16, f32 accumulator
__device__ __forceinline__ void mma_m16n8k16_bf16_f32(float (&accumulator)[4], const unsigned (&a)[4], unsigned b0,
                                                      unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, "
      "%3};\n"
      : "+f"(accumulator[0]), "+f"(accumulator[1]), "+f"(accumulator[2]), "+f"(accumulator[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- ldmatrix: fragment[i] = this lane's part of 8x8 matrix i; lanes 8i..8i+7 give the addresses of its rows ----
// volatile: the load must stay between the barriers that publish and recycle the shared tile.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

// The same, each matrix transposed
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&fragment)[4], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(fragment[0]), "=r"(fragment[1]), "=r"(fragment[2]), "=r"(fragment[3])
               : "r"(shared_address));
}

// Two matrices: lanes 0-15 address them
__device__ __forceinline__ void ldmatrix_x2(unsigned (&fragment)[2], unsigned shared_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(fragment[0]), "=r"(fragment[1])
               : "r"(shared_address));
}

// ---- cp.async: global -> shared copies, grouped and waited on by the multi-stage pipeline ----
// 16 bytes, bypassing L1 (cp.async.cg); when !fill nothing is read and the bytes become 0
__device__ __forceinline__ void cp_async_16(unsigned shared_address, const void *global_address, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global_address),
               "r"(fill ? 16 : 0));
}

// 4 bytes (cp.async.ca: sizes below 16 bytes go through L1)
__device__ __forceinline__ void cp_async_4(unsigned shared_address, const void *global_address) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address), "l"(global_address));
}

// Closes the group of cp.async copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Waits until at most kPending committed groups are still in flight
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

} // namespace sage::device::sm80
