// Shared-memory tiles for wgmma operands written by the threads themselves (cp.async, st.shared) rather than TMA, and
// the bulk reduction of an f32 tile into global memory: used by the kernels that stage their own tiles (SageBwd's
// wgmma backward, SLA's wgmma kernels).
#pragma once

#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/warpgroup.cuh"

namespace sage::device::sm90 {

// A [kRows][kRowBytes] tile in wgmma's K-major layout: column chunks of at most 128 bytes, each [kRows][chunk bytes]
// with the swizzle of that row length (the 16-byte unit index XOR address bits 7.. as the descriptor's mode does).
// Tiles start at 1024-byte boundaries, so offsets within a tile have the address's swizzle bits.
template <int kRows, int kRowBytes> struct SwizzledTile {
  static constexpr int kChunkBytes = kRowBytes < 128 ? kRowBytes : 128;
  static constexpr int kChunkStride = kRows * kChunkBytes;
  static constexpr int kBytes = (kRowBytes / kChunkBytes) * kChunkStride;
  static constexpr Swizzle kSwizzle = swizzle_of_rows<kChunkBytes>();
  static constexpr int kUnitMask = kChunkBytes / 16 - 1;

  static __device__ __forceinline__ int offset(int row, int column) {
    const int linear = row * kChunkBytes + column % kChunkBytes;
    return column / kChunkBytes * kChunkStride + (linear ^ (((linear >> 7) & kUnitMask) << 4));
  }
  // The K-major operand of rows row0.. (a multiple of 8) whose k step starts at byte `column` (a multiple of 32):
  // matrix_descriptor's fields for LBO 16 bytes (unused) and SBO 8 rows, with the start address added in 16-byte
  // units without masking (shared addresses stay below 2^18, so the 14-bit field never carries into LBO), so that a
  // tile's descriptors share one base and differ by immediates. The low word is one 32-bit sum (base + immediate per
  // wgmma; an OR after the add cost one more uniform instruction per wgmma in SageBwd's main kernel, ncu 2026-11-24).
  static constexpr unsigned long long kFixedBits = matrix_descriptor(0, 16, 8 * kChunkBytes, kSwizzle);
  static __device__ __forceinline__ unsigned long long descriptor(unsigned tile, int column, int row0 = 0) {
    const unsigned offset = column / kChunkBytes * kChunkStride + row0 * kChunkBytes + column % kChunkBytes;
    const unsigned low = static_cast<unsigned>(kFixedBits) + (tile >> 4) + (offset >> 4);
    return (kFixedBits & 0xffffffff00000000ull) | low;
  }
};

// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible to wgmma's async proxy; a
// barrier after it publishes them to the warpgroup(s) that issue the wgmma.
__device__ __forceinline__ void fence_shared_for_wgmma() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The low byte of `value` at a shared-memory address (32-bit: no generic-to-shared conversion per store).
__device__ __forceinline__ void store_shared_byte(unsigned address, unsigned value) {
  asm volatile("st.shared.b8 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}

__device__ __forceinline__ void store_shared_pair(unsigned address, float low, float high) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(low), "f"(high) : "memory");
}

// global[0 .. bytes) += shared tile (f32), by the bulk-copy engine (one thread issues it; cp.async.bulk groups).
__device__ __forceinline__ void bulk_reduce_add_f32(float *global, unsigned shared, int bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global),
               "r"(shared), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Waits until the issuing thread's bulk operations have read their shared-memory source (it may be rewritten).
__device__ __forceinline__ void bulk_wait_source_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until the issuing thread's bulk operations are complete.
__device__ __forceinline__ void bulk_wait_complete() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

} // namespace sage::device::sm90
