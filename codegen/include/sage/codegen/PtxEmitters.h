// One emitter per PTX instruction family: each returns the CUDA text of a small __device__ __forceinline__
// function wrapping the instruction in inline PTX. The attention kernel generator pastes the ones it uses.
// Fragments are passed as 32-bit registers: `unsigned` for packed 8/16-bit values, `int`/`float` accumulators.
#pragma once

#include "sage/schedules/KernelPlan.h"

#include <string>

namespace sage::codegen {

// ---- mma.sync (MmaEmitter.cpp) ----
// "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" and friends. Supported: s8 m16n8k32 s32, f16 m16n8k16 with
// f16 or f32 accumulate, bf16 m16n8k16 f32, e4m3 m16n8k32 f32. Throws std::invalid_argument for others.
std::string mmaInstruction(const schedules::MmaShape &shape);
std::string mmaFunctionName(const schedules::MmaShape &shape); // "mma_m16n8k32_s8_s32"
// void NAME(ACC (&accumulator)[N], const unsigned (&a)[4], unsigned b0, unsigned b1): accumulator += a.b
std::string emitMmaFunction(const schedules::MmaShape &shape);

// ---- ldmatrix (LdmatrixEmitter.cpp) ----
// void NAME(unsigned (&fragment)[matrices], unsigned shared_address): ldmatrix.sync.aligned.m8n8.xN[.trans].b16
std::string ldmatrixInstruction(int matrices, bool transposed);
std::string ldmatrixFunctionName(int matrices, bool transposed); // "ldmatrix_x4_trans"
std::string emitLdmatrixFunction(int matrices, bool transposed);

// ---- cp.async (CpAsyncEmitter.cpp) ----
// cp_async_16(shared, global, fill): cp.async.cg 16 bytes, zero-filled when !fill (src-size 0);
// cp_async_4(shared, global): cp.async.ca 4 bytes; cp_async_commit(): commit_group;
// cp_async_wait<N>(): wait_group N (at most N groups still in flight).
std::string emitCpAsyncCopy16Function();
std::string emitCpAsyncCopy4Function();
std::string emitCpAsyncCommitFunction();
std::string emitCpAsyncWaitFunction();

// ---- special functions and conversions (ConversionEmitter.cpp) ----
std::string emitExp2Function();        // float fast_exp2(float): ex2.approx.ftz.f32
std::string emitLog2Function();        // float fast_log2(float): lg2.approx.ftz.f32
std::string emitPackF16x2Function();   // unsigned pack_f16x2(float low, float high): cvt.rn.f16x2.f32
std::string emitPackBf16x2Function();  // unsigned pack_bf16x2(float low, float high): cvt.rn.bf16x2.f32
std::string emitUnpackF16x2Function(); // void unpack_f16x2(unsigned, float &low, float &high): cvt.f32.f16
std::string emitScaleF16x2Function();  // unsigned scale_f16x2(unsigned value, unsigned factor): mul.rn.f16x2
std::string emitPackS8x4Function();    // unsigned pack_s8x4(float x0..x3): cvt.rni.s32.f32, cvt.pack.sat.s8.s32.b32
std::string emitPackE4m3x4Function();  // unsigned pack_e4m3x4(float x0..x3): cvt.rn.satfinite.e4m3x2.f32 (sm_89+)

} // namespace sage::codegen
