// Tensor-core helpers of SLA's linear branch: f16 splitting, ldmatrix and mma.sync m16n8k16 (f16 in, f32 accumulate;
// sm_80 and later), and one warp's 16 x 8 tile of a product of two f16 matrices held in shared memory.
//
// An f32 operand x goes to the tensor cores as two f16 numbers, hi = f16(x) and lo = f16(x - hi); the products
// hi*hi + hi*lo + lo*hi then carry about 22 bits of x (the dropped lo*lo term is ~2^-22 relative), so the linear
// branch loses nothing measurable to f16 operands while the matrix products run on tensor cores.
#pragma once

#include "sage/device/lanes.cuh"

namespace sage::device::sla {

__device__ __forceinline__ unsigned short f16_bits(float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  return bits;
}

__device__ __forceinline__ float f16_value(unsigned short bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
  return value;
}

// Two f16 numbers in one register, `low` at the lower address (the lower column of a fragment pair).
__device__ __forceinline__ unsigned pack_f16x2(unsigned short low, unsigned short high) {
  return static_cast<unsigned>(low) | (static_cast<unsigned>(high) << 16);
}

// x = hi + lo (up to ~2^-22 relative), both f16.
__device__ __forceinline__ void split_f16(float value, unsigned short &hi, unsigned short &lo) {
  hi = f16_bits(value);
  lo = f16_bits(value - f16_value(hi));
}

// ---- The module's element type (Q, K, V, O^s, O; kBf16: bf16, else f16). The f16 forms are the functions above. In
// a bf16 module the products that take those tensors' rows as they are (V in the states, V and dh_j in the kv backward,
// the sparse part's Q, K, V, dO^s, P, dS) run on bf16 tensor-core operands: bf16 keeps f32's exponent range, so V of
// any magnitude (1e5 overflows f16) is exact, and a split x = hi + lo in bf16 carries ~16 bits of x (the dropped lo*lo
// term is ~2^-16 relative), still 2^7 finer than the bf16 outputs' rounding (the states behind them are stored with
// 11 bits, as in an f16 module).

template <bool kBf16> __device__ __forceinline__ unsigned short element_bits(float value) {
  if constexpr (kBf16) {
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(value));
    return bits;
  } else {
    return f16_bits(value);
  }
}

template <bool kBf16> __device__ __forceinline__ float element_value(unsigned short bits) {
  if constexpr (kBf16)
    return __uint_as_float(static_cast<unsigned>(bits) << 16); // exact
  else
    return f16_value(bits);
}

// x = hi + lo in the element type.
template <bool kBf16>
__device__ __forceinline__ void split_element(float value, unsigned short &hi, unsigned short &lo) {
  hi = element_bits<kBf16>(value);
  lo = element_bits<kBf16>(value - element_value<kBf16>(hi));
}

__device__ __forceinline__ unsigned shared_address(const void *pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

template <bool kTransposed> __device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  if (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

template <bool kTransposed> __device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], unsigned address) {
  if (kTransposed)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(address));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(address));
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// mma_f16, or its bf16 form (bf16 operands, f32 accumulation).
template <bool kBf16>
__device__ __forceinline__ void mma_16bit(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  if constexpr (kBf16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    mma_f16(c, a, b);
}

// One f16 matrix in shared memory, row-major with `stride` elements per row (a multiple of 8, so every ldmatrix row
// is 16-byte aligned; a stride of columns + 8 spreads 8 consecutive rows over all banks).
struct SharedF16 {
  const unsigned short *base;
  int stride;
};

// A operand (16 x 16 at m0, k0) of C = A B. kAKMajor: the matrix is stored as A^T ([k][m]).
template <bool kAKMajor> __device__ __forceinline__ void load_a(unsigned (&a)[4], SharedF16 s, int m0, int k0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8, row = lane % 8;
  // Fragment order: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15).
  const int m = m0 + (matrix & 1) * 8, k = k0 + (matrix >> 1) * 8;
  const unsigned short *at = kAKMajor ? s.base + (k + row) * s.stride + m : s.base + (m + row) * s.stride + k;
  ldmatrix_x4<kAKMajor>(a, shared_address(at));
}

// B operand (16 x 8 at k0, n0). kBKMajor: stored as B ([k][n]); otherwise as B^T ([n][k]), e.g. a weight [out][in].
template <bool kBKMajor> __device__ __forceinline__ void load_b(unsigned (&b)[2], SharedF16 s, int k0, int n0) {
  const int lane = threadIdx.x % 16, matrix = lane / 8, row = lane % 8; // lanes 16-31 repeat (x2 reads 0-15)
  const unsigned short *at =
      kBKMajor ? s.base + (k0 + matrix * 8 + row) * s.stride + n0 : s.base + (n0 + row) * s.stride + k0 + matrix * 8;
  ldmatrix_x2<kBKMajor>(b, shared_address(at));
}

// c += A[m0:m0+16, 0:K] B[0:K, n0:n0+8] with both operands split in hi and lo parts (three products).
template <int K, bool kAKMajor, bool kBKMajor>
__device__ __forceinline__ void mma_tile_split(float (&c)[4], SharedF16 a_hi, SharedF16 a_lo, SharedF16 b_hi,
                                               SharedF16 b_lo, int m0, int n0) {
  static_assert(K % 16 == 0, "the reduction runs in steps of 16");
#pragma unroll 2 // the output kernel keeps H_i in registers meanwhile: few fragments in flight
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned ah[4], al[4], bh[2], bl[2];
    load_a<kAKMajor>(ah, a_hi, m0, k0);
    load_a<kAKMajor>(al, a_lo, m0, k0);
    load_b<kBKMajor>(bh, b_hi, k0, n0);
    load_b<kBKMajor>(bl, b_lo, k0, n0);
    mma_f16(c, al, bh);
    mma_f16(c, ah, bl);
    mma_f16(c, ah, bh);
  }
}

// c += A B where only A is split (B is exactly f16, e.g. V).
template <int K, bool kAKMajor, bool kBKMajor>
__device__ __forceinline__ void mma_tile_split_a(float (&c)[4], SharedF16 a_hi, SharedF16 a_lo, SharedF16 b, int m0,
                                                 int n0) {
  static_assert(K % 16 == 0, "the reduction runs in steps of 16");
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned ah[4], al[4], bh[2];
    load_a<kAKMajor>(ah, a_hi, m0, k0);
    load_a<kAKMajor>(al, a_lo, m0, k0);
    load_b<kBKMajor>(bh, b, k0, n0);
    mma_f16(c, al, bh);
    mma_f16(c, ah, bh);
  }
}

// cp.async (sm_80+), 16 bytes global -> shared, bypassing L1; `valid` false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void copy16_async(void *shared, const void *global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 4 bytes global -> shared without registers (the fused backward's L and D^s rows), in the current group of copies.
__device__ __forceinline__ void copy_4_async(void *shared, const void *global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(shared)), "l"(global));
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void wait_all_copies() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most the kPending most recent groups of this thread's copies are in flight.
template <int kPending> __device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// max |x| over a thread's registers: the amax a power-of-two f16 range factor is taken from.
template <int N, int E> __device__ __forceinline__ float largest_magnitude(const float (&x)[N][E]) {
  float largest = 0.0f;
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < E; ++e)
      largest = fmaxf(largest, fabsf(x[n][e]));
  return largest;
}
template <int M, int N> __device__ __forceinline__ float largest_magnitude(const float (&tiles)[M][N][4]) {
  float largest = 0.0f;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        largest = fmaxf(largest, fabsf(tiles[m][n][e]));
  return largest;
}

__device__ __forceinline__ int tile_row() { return (threadIdx.x % 32) / 4; }
__device__ __forceinline__ int tile_col() { return (threadIdx.x % 4) * 2; }

} // namespace sage::device::sla
