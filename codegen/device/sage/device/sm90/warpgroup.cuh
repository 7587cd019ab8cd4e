// Warpgroup-level primitives of sm_90a: the wgmma issue protocol (fence, commit, wait), shared-memory matrix
// descriptors, register-budget hand-over between producer and consumer warpgroups (setmaxnreg) and named barriers.
#pragma once

#include "sage/device/sm90/common.cuh"

namespace sage::device::sm90 {

constexpr int kWarpgroupThreads = 128;

// Orders this warpgroup's earlier register and shared-memory writes before the wgmma that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit_group() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most kPending committed wgmma groups of this warpgroup are still running.
template <int kPending> __device__ __forceinline__ void wgmma_wait_group() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across an asynchronous wgmma: every
// register is an in/out operand of an empty asm statement.
template <int kCount> __device__ __forceinline__ void warpgroup_fence_operands(float (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+f"(registers[i])::"memory");
}

template <int kCount> __device__ __forceinline__ void warpgroup_fence_operands(int (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+r"(registers[i])::"memory");
}

template <int kCount> __device__ __forceinline__ void warpgroup_fence_operands(unsigned (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+r"(registers[i])::"memory");
}

// Shared-memory swizzle of a tile whose rows are `kRowBytes` long (TMA writes it, wgmma reads it the same way):
// 128-, 64- or 32-byte rows, one swizzle atom of 8 rows.
enum class Swizzle : unsigned { none = 0, bytes128 = 1, bytes64 = 2, bytes32 = 3 };

template <int kRowBytes> __host__ __device__ constexpr Swizzle swizzle_of_rows() {
  static_assert(kRowBytes == 128 || kRowBytes == 64 || kRowBytes == 32, "swizzled rows are 32, 64 or 128 bytes");
  return kRowBytes == 128 ? Swizzle::bytes128 : (kRowBytes == 64 ? Swizzle::bytes64 : Swizzle::bytes32);
}

// The 64-bit wgmma matrix descriptor: start address, leading- and stride-dimension byte offsets (16-byte units)
// and the swizzle mode. Tiles start at 1024-byte boundaries, so the base offset field stays 0.
//   K-major (8-bit operands, and 16-bit A/B in their natural layout): LBO unused (one swizzle row spans the
//   instruction's K), SBO = 8 rows x row bytes (the next 8-row core-matrix group along M/N).
//   MN-major (16-bit B transposed, V as [tokens, channels]): LBO = bytes between consecutive swizzle atoms along N
//   (column chunks of the tile), SBO = 8 rows x row bytes (the next 8 tokens along K).
__host__ __device__ __forceinline__ constexpr unsigned long long
matrix_descriptor(unsigned address, unsigned leading_bytes, unsigned stride_bytes, Swizzle swizzle) {
  unsigned long long descriptor = static_cast<unsigned long long>((address & 0x3FFFFu) >> 4);
  descriptor |= static_cast<unsigned long long>((leading_bytes >> 4) & 0x3FFFu) << 16;
  descriptor |= static_cast<unsigned long long>((stride_bytes >> 4) & 0x3FFFu) << 32;
  descriptor |= static_cast<unsigned long long>(swizzle) << 62;
  return descriptor;
}

// A tile's descriptor from matrix_descriptor's fixed fields (`fixed_bits`: address 0) and a shared-window address
// below 2^18, added in 16-byte units without masking: the descriptors of one tile's steps then differ by immediates
// instead of each being masked and shifted again.
__device__ __forceinline__ unsigned long long descriptor_at(unsigned long long fixed_bits, unsigned address) {
  return fixed_bits + (address >> 4);
}

// Register budget hand-over (sm_90a): the producer warpgroup gives registers back, the consumers take them.
template <int kRegisters> __device__ __forceinline__ void warpgroup_release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

template <int kRegisters> __device__ __forceinline__ void warpgroup_claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// bar.sync on a named barrier among `threads` threads (a multiple of 32); id 0 is __syncthreads'.
// True in one lane of the calling (converged) warp: a warp-uniform branch to it keeps the warp's other work
// convergent, where `threadIdx.x == 0` makes ptxas open a divergent region.
__device__ __forceinline__ bool elect_one_sync() {
  unsigned elected = 0;
  asm volatile("{\n"
               "  .reg .pred p;\n"
               "  elect.sync _|p, 0xffffffff;\n"
               "  selp.u32 %0, 1, 0, p;\n"
               "}\n"
               : "=r"(elected));
  return elected != 0;
}

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

} // namespace sage::device::sm90
