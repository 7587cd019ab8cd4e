// TMA (cp.async.bulk.tensor) loads of tiles described by a CUtensorMap that the runtime encoded with
// cuTensorMapEncodeTiled and passed in the kernel's __grid_constant__ parameters. The copy engine writes the box
// into shared memory (swizzled as the map says) and signals the mbarrier with the bytes it wrote; boxes that reach
// past the tensor's bounds are zero-filled. Also the plain bulk copy of contiguous bytes (no tensor map).
#pragma once

#include "sage/device/sm90/common.cuh"

namespace sage::device::sm90 {

// The opaque 128-byte CUtensorMap (KernelAbi.h's SageTensorMap), addressed generically as the instruction wants.
__device__ __forceinline__ unsigned long long tensor_map_address(const void *map) {
  return reinterpret_cast<unsigned long long>(map);
}

__device__ __forceinline__ void tma_prefetch_descriptor(const void *map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map_address(map)) : "memory");
}

// Box at coordinates (x0 innermost, x1) into `destination`; completion counted on `barrier`.
__device__ __forceinline__ void tma_load_2d(unsigned destination, const void *map, unsigned barrier, int x0, int x1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
               "[%2];\n" ::"r"(destination),
               "l"(tensor_map_address(map)), "r"(barrier), "r"(x0), "r"(x1)
               : "memory");
}

// Box at coordinates (x0 innermost, x1, x2, x3) into `destination`; completion counted on `barrier`.
__device__ __forceinline__ void tma_load_4d(unsigned destination, const void *map, unsigned barrier, int x0, int x1,
                                            int x2, int x3) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
               "%5, %6}], [%2];\n" ::"r"(destination),
               "l"(tensor_map_address(map)), "r"(barrier), "r"(x0), "r"(x1), "r"(x2), "r"(x3)
               : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global memory to `destination` as they are;
// completion counted on `barrier`.
__device__ __forceinline__ void bulk_copy_to_shared(unsigned destination, const void *source, unsigned bytes,
                                                    unsigned barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(destination),
      "l"(source), "r"(bytes), "r"(barrier)
      : "memory");
}

} // namespace sage::device::sm90
