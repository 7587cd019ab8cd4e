// wgmma.mma_async instructions, one function per (operand types, N) that the sm90 attention kernel uses. Each
// accumulator register is its own asm operand, which is why these lists are long: the compiler must keep the
// accumulators in registers across the asynchronous instruction (see warpgroup_fence_operands).
//
// Shapes: M = 64 rows per warpgroup; K = 32 for 8-bit operands, 16 for 16-bit ones; N = 64 or 128 (and 32 for s8 SS;
// 96 for the 8-bit P.V's column slices at head_dim 192; 192 and 256 for f16 P.V into an f16 accumulator).
//   *_ss: A and B from shared memory (descriptors); *_rs: A from registers (4 x b32 per thread), B from shared.
//   scale_d = 0 overwrites the accumulator (D = A.B), 1 accumulates (D += A.B).
//   16-bit B with kTransposeB = 1 is MN-major in shared memory (V as [tokens, channels]); 8-bit B is K-major.
// The accumulator operand lists come from the SAGE_WGMMA_* macros below, so each wrapper states only what differs:
// its types, shape, the numbers of the operands after the accumulators, and the instruction's trailing immediates.
#pragma once

#include "sage/device/sm90/common.cuh"

// "%0, ..., %(n - 1)": the accumulators' placeholders in the instruction text.
#define SAGE_WGMMA_D_16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define SAGE_WGMMA_D_32                                                                                                \
  SAGE_WGMMA_D_16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define SAGE_WGMMA_D_48                                                                                                \
  SAGE_WGMMA_D_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define SAGE_WGMMA_D_64                                                                                                \
  SAGE_WGMMA_D_32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "  \
                  "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// The accumulators as read-write asm operands, each register its own operand; C is "+r" or "+f".
#define SAGE_WGMMA_ACC_8(C, i)                                                                                         \
  C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]), C(d[i + 7])
#define SAGE_WGMMA_ACC_16(C) SAGE_WGMMA_ACC_8(C, 0), SAGE_WGMMA_ACC_8(C, 8)
#define SAGE_WGMMA_ACC_32(C) SAGE_WGMMA_ACC_16(C), SAGE_WGMMA_ACC_8(C, 16), SAGE_WGMMA_ACC_8(C, 24)
#define SAGE_WGMMA_ACC_48(C) SAGE_WGMMA_ACC_32(C), SAGE_WGMMA_ACC_8(C, 32), SAGE_WGMMA_ACC_8(C, 40)
#define SAGE_WGMMA_ACC_64(C)                                                                                           \
  SAGE_WGMMA_ACC_32(C), SAGE_WGMMA_ACC_8(C, 32), SAGE_WGMMA_ACC_8(C, 40), SAGE_WGMMA_ACC_8(C, 48),                     \
      SAGE_WGMMA_ACC_8(C, 56)

// The wrapper's run(): COUNT accumulators of type T (constraint C), A_PARAM the A operand (a shared-memory descriptor
// or four registers), SCALE the placeholder of scale_d, OPERANDS the instruction's operands after the accumulators,
// the rest the asm inputs in placeholder order.
#define SAGE_WGMMA_RUN(T, C, COUNT, A_PARAM, SHAPE, SCALE, OPERANDS, ...)                                              \
  static __device__ __forceinline__ void run(T(&d)[COUNT], A_PARAM, unsigned long long desc_b, int scale_d) {          \
    asm volatile("{\n"                                                                                                 \
                 ".reg .pred p;\n"                                                                                     \
                 "setp.ne.b32 p, " SCALE ", 0;\n"                                                                      \
                 "wgmma.mma_async.sync.aligned." SHAPE "\n"                                                            \
                 "{" SAGE_WGMMA_D_##COUNT "},\n" OPERANDS ";\n}\n"                                                     \
                 : SAGE_WGMMA_ACC_##COUNT(C)                                                                           \
                 : __VA_ARGS__);                                                                                       \
  }
// A and B from shared memory: the inputs are desc_a, desc_b, scale_d.
#define SAGE_WGMMA_SS_RUN(T, C, COUNT, SHAPE, SCALE, OPERANDS)                                                         \
  SAGE_WGMMA_RUN(T, C, COUNT, unsigned long long desc_a, SHAPE, SCALE, OPERANDS, "l"(desc_a), "l"(desc_b), "r"(scale_d))
// A from registers: the inputs are a[0..3], desc_b, scale_d.
#define SAGE_WGMMA_RS_RUN(T, C, COUNT, SHAPE, SCALE, OPERANDS)                                                         \
  SAGE_WGMMA_RUN(T, C, COUNT, const unsigned(&a)[4], SHAPE, SCALE, OPERANDS, "r"(a[0]), "r"(a[1]), "r"(a[2]),          \
                 "r"(a[3]), "l"(desc_b), "r"(scale_d))

namespace sage::device::sm90 {

template <int N> struct WgmmaS8SS;

// D(s32) += A(s8, smem) B(s8, smem), N = 32 (the backward's dQ at head_dim 64: half the channels per warpgroup)
template <> struct WgmmaS8SS<32> { SAGE_WGMMA_SS_RUN(int, "+r", 16, "m64n32k32.s32.s8.s8", "%18", "%16, %17, p") };

// D(s32) += A(s8, smem) B(s8, smem), N = 64
template <> struct WgmmaS8SS<64> { SAGE_WGMMA_SS_RUN(int, "+r", 32, "m64n64k32.s32.s8.s8", "%34", "%32, %33, p") };

// D(s32) += A(s8, smem) B(s8, smem), N = 128
template <> struct WgmmaS8SS<128> { SAGE_WGMMA_SS_RUN(int, "+r", 64, "m64n128k32.s32.s8.s8", "%66", "%64, %65, p") };

template <int N> struct WgmmaF16SS;

// D(f32) += A(f16, smem, K-major) B(f16, smem, K-major), N = 64
template <> struct WgmmaF16SS<64> {
  SAGE_WGMMA_SS_RUN(float, "+f", 32, "m64n64k16.f32.f16.f16", "%34", "%32, %33, p, 1, 1, 0, 0")
};

// D(f32) += A(f16, smem, K-major) B(f16, smem, K-major), N = 128
template <> struct WgmmaF16SS<128> {
  SAGE_WGMMA_SS_RUN(float, "+f", 64, "m64n128k16.f32.f16.f16", "%66", "%64, %65, p, 1, 1, 0, 0")
};

template <int N, int kTransposeA> struct WgmmaF16SSTransposedB;

// D(f32) += A(f16, smem) B(f16, smem, MN-major), N = 64; A K-major, or MN-major with kTransposeA (SLA's fused sparse
// backward: dQ = dS K from dS^T [key][query] and K [key][channel], 64 channels at a time)
template <int kTransposeA> struct WgmmaF16SSTransposedB<64, kTransposeA> {
  SAGE_WGMMA_RUN(float, "+f", 32, unsigned long long desc_a, "m64n64k16.f32.f16.f16", "%34",
                 "%32, %33, p, 1, 1, %35, 1", "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransposeA))
};

// D(f32) += A(f16, smem) B(f16, smem, MN-major), N = 128; A K-major, or MN-major with kTransposeA (the SLA mask
// GEMMs: their states are [summed block][column], the backward's mask tile [summed block][row])
template <int kTransposeA> struct WgmmaF16SSTransposedB<128, kTransposeA> {
  SAGE_WGMMA_RUN(float, "+f", 64, unsigned long long desc_a, "m64n128k16.f32.f16.f16", "%66",
                 "%64, %65, p, 1, 1, %67, 1", "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransposeA))
};

template <int N> struct WgmmaBf16SS;

// D(f32) += A(bf16, smem, K-major) B(bf16, smem, K-major), N = 64
template <> struct WgmmaBf16SS<64> {
  SAGE_WGMMA_SS_RUN(float, "+f", 32, "m64n64k16.f32.bf16.bf16", "%34", "%32, %33, p, 1, 1, 0, 0")
};

// D(f32) += A(bf16, smem, K-major) B(bf16, smem, K-major), N = 128
template <> struct WgmmaBf16SS<128> {
  SAGE_WGMMA_SS_RUN(float, "+f", 64, "m64n128k16.f32.bf16.bf16", "%66", "%64, %65, p, 1, 1, 0, 0")
};

template <int N> struct WgmmaE4m3RS;

// D(f32) += A(e4m3, registers) B(e4m3, smem, K-major), N = 96 (a column slice of e4m3 P.V at head_dim 192)
template <> struct WgmmaE4m3RS<96> {
  SAGE_WGMMA_RS_RUN(float, "+f", 48, "m64n96k32.f32.e4m3.e4m3", "%53", "{%48, %49, %50, %51}, %52, p, 1, 1")
};

// D(f32) += A(e4m3, registers) B(e4m3, smem, K-major), N = 64
template <> struct WgmmaE4m3RS<64> {
  SAGE_WGMMA_RS_RUN(float, "+f", 32, "m64n64k32.f32.e4m3.e4m3", "%37", "{%32, %33, %34, %35}, %36, p, 1, 1")
};

// D(f32) += A(e4m3, registers) B(e4m3, smem, K-major), N = 128
template <> struct WgmmaE4m3RS<128> {
  SAGE_WGMMA_RS_RUN(float, "+f", 64, "m64n128k32.f32.e4m3.e4m3", "%69", "{%64, %65, %66, %67}, %68, p, 1, 1")
};

template <int N> struct WgmmaS8RS;

// D(s32) += A(s8, registers) B(s8, smem, K-major), N = 96 (a column slice of int8 P.V at head_dim 192)
template <> struct WgmmaS8RS<96> {
  SAGE_WGMMA_RS_RUN(int, "+r", 48, "m64n96k32.s32.s8.s8", "%53", "{%48, %49, %50, %51}, %52, p")
};

// D(s32) += A(s8, registers) B(s8, smem, K-major), N = 64
template <> struct WgmmaS8RS<64> {
  SAGE_WGMMA_RS_RUN(int, "+r", 32, "m64n64k32.s32.s8.s8", "%37", "{%32, %33, %34, %35}, %36, p")
};

// D(s32) += A(s8, registers) B(s8, smem, K-major), N = 128
template <> struct WgmmaS8RS<128> {
  SAGE_WGMMA_RS_RUN(int, "+r", 64, "m64n128k32.s32.s8.s8", "%69", "{%64, %65, %66, %67}, %68, p")
};

template <int N> struct WgmmaF16RSF32;

// D(f32) += A(f16, registers) B(f16, smem, MN-major), N = 64
template <> struct WgmmaF16RSF32<64> {
  SAGE_WGMMA_RS_RUN(float, "+f", 32, "m64n64k16.f32.f16.f16", "%37", "{%32, %33, %34, %35}, %36, p, 1, 1, 1")
};

// D(f32) += A(f16, registers) B(f16, smem, MN-major), N = 128
template <> struct WgmmaF16RSF32<128> {
  SAGE_WGMMA_RS_RUN(float, "+f", 64, "m64n128k16.f32.f16.f16", "%69", "{%64, %65, %66, %67}, %68, p, 1, 1, 1")
};

template <int N> struct WgmmaF16RSF16;

// D(f16x2) += A(f16, registers) B(f16, smem, MN-major), N = 64
template <> struct WgmmaF16RSF16<64> {
  SAGE_WGMMA_RS_RUN(unsigned, "+r", 16, "m64n64k16.f16.f16.f16", "%21", "{%16, %17, %18, %19}, %20, p, 1, 1, 1")
};

// D(f16x2) += A(f16, registers) B(f16, smem, MN-major), N = 128
template <> struct WgmmaF16RSF16<128> {
  SAGE_WGMMA_RS_RUN(unsigned, "+r", 32, "m64n128k16.f16.f16.f16", "%37", "{%32, %33, %34, %35}, %36, p, 1, 1, 1")
};

// D(f16x2) += A(f16, registers) B(f16, smem, MN-major), N = 192: head_dim 192's whole O in one instruction
template <> struct WgmmaF16RSF16<192> {
  SAGE_WGMMA_RS_RUN(unsigned, "+r", 48, "m64n192k16.f16.f16.f16", "%53", "{%48, %49, %50, %51}, %52, p, 1, 1, 1")
};

// D(f16x2) += A(f16, registers) B(f16, smem, MN-major), N = 256: head_dim 256's whole O in one instruction
template <> struct WgmmaF16RSF16<256> {
  SAGE_WGMMA_RS_RUN(unsigned, "+r", 64, "m64n256k16.f16.f16.f16", "%69", "{%64, %65, %66, %67}, %68, p, 1, 1, 1")
};

} // namespace sage::device::sm90

#undef SAGE_WGMMA_RS_RUN
#undef SAGE_WGMMA_SS_RUN
#undef SAGE_WGMMA_RUN
#undef SAGE_WGMMA_ACC_64
#undef SAGE_WGMMA_ACC_48
#undef SAGE_WGMMA_ACC_32
#undef SAGE_WGMMA_ACC_16
#undef SAGE_WGMMA_ACC_8
#undef SAGE_WGMMA_D_64
#undef SAGE_WGMMA_D_48
#undef SAGE_WGMMA_D_32
#undef SAGE_WGMMA_D_16
