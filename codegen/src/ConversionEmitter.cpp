// Special functions (ex2, lg2) and the packing conversions between f32 and the mma operand types.
#include "sage/codegen/PtxEmitters.h"

namespace sage::codegen {

std::string emitExp2Function() {
  return R"(// 2^x (ex2.approx.ftz: 2 ulp, flushes denormals; 2^-inf = +0)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
)";
}

std::string emitLog2Function() {
  return R"(// log2(x) (lg2.approx.ftz)
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
)";
}

std::string emitPackF16x2Function() {
  return R"(// Two f32 -> one f16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_f16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}
)";
}

std::string emitPackBf16x2Function() {
  return R"(// Two f32 -> one bf16x2 register, round to nearest even; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_bf16x2(float low, float high) {
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
}
)";
}

std::string emitUnpackF16x2Function() {
  return R"(// One f16x2 register -> two f32 (exact)
__device__ __forceinline__ void unpack_f16x2(unsigned packed, float &low, float &high) {
  asm("{\n"
      "  .reg .f16 low_half, high_half;\n"
      "  mov.b32 {low_half, high_half}, %2;\n"
      "  cvt.f32.f16 %0, low_half;\n"
      "  cvt.f32.f16 %1, high_half;\n"
      "}\n"
      : "=f"(low), "=f"(high)
      : "r"(packed));
}
)";
}

std::string emitScaleF16x2Function() {
  return R"(// Both halves of an f16x2 register times the halves of `factor` (mul.rn.f16x2)
__device__ __forceinline__ unsigned scale_f16x2(unsigned value, unsigned factor) {
  unsigned product;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(product) : "r"(value), "r"(factor));
  return product;
}
)";
}

std::string emitPackS8x4Function() {
  return R"(// Four f32 -> four saturated int8 codes (round to nearest even) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_s8x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .s32 code0, code1, code2, code3;\n"
      "  .reg .b32 upper;\n"
      "  cvt.rni.s32.f32 code0, %1;\n"
      "  cvt.rni.s32.f32 code1, %2;\n"
      "  cvt.rni.s32.f32 code2, %3;\n"
      "  cvt.rni.s32.f32 code3, %4;\n"
      "  cvt.pack.sat.s8.s32.b32 upper, code3, code2, 0;\n"
      "  cvt.pack.sat.s8.s32.b32 %0, code1, code0, upper;\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}
)";
}

std::string emitPackE4m3x4Function() {
  return R"(// Four f32 -> four e4m3 codes (round to nearest even, saturate to +-448) in one register; x0 in bits 0-7
__device__ __forceinline__ unsigned pack_e4m3x4(float x0, float x1, float x2, float x3) {
  unsigned packed;
  asm("{\n"
      "  .reg .b16 low_pair, high_pair;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 low_pair, %2, %1;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 high_pair, %4, %3;\n"
      "  mov.b32 %0, {low_pair, high_pair};\n"
      "}\n"
      : "=r"(packed)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return packed;
}
)";
}

} // namespace sage::codegen
