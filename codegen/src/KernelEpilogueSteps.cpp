// The epilogue: O_i = diag(l_i)^-1 O_i (+ mean(V)) written in the input's dtype, and the LSE.
#include "KernelText.h"

#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;

constexpr std::string_view kCollectF16 = R"(// ---- Epilogue: O_i in f32 from the f16 accumulator@FLUSHED_NOTE@ ----
__device__ __forceinline__ void collect_output(float (&output)[kRowTiles][kOutputTiles][4],
                                               const unsigned (&o_accumulator)[kRowTiles][kOutputTiles][2]@FLUSHED_PARAMETER@) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        unpack_f16x2(o_accumulator[row_tile][tile][half], output[row_tile][tile][half * 2],
                     output[row_tile][tile][half * 2 + 1]);
@FLUSHED_ADD@      }
}

)";

constexpr std::string_view kCollectF32 = R"(// ---- Epilogue: O_i in f32@FLUSHED_NOTE@ ----
__device__ __forceinline__ void collect_output(float (&output)[kRowTiles][kOutputTiles][4],
                                               const float (&o_accumulator)[kRowTiles][kOutputTiles][4]@FLUSHED_PARAMETER@) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int tile = 0; tile < kOutputTiles; ++tile)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        output[row_tile][tile][i] = o_accumulator[row_tile][tile][i]@FLUSHED_TERM@;
}

)";

constexpr std::string_view kWriteOutput =
    R"(// ---- Epilogue: O_i = diag(l_i)^-1 O_i@DEQUANT_NOTE@@MEAN_NOTE@, in @OUTPUT_TYPE@ ----
// Rows past tokens_q are not written; a row that saw no visible key (l = 0) gets O = 0.
__device__ __forceinline__ void write_output(const float (&output)[kRowTiles][kOutputTiles][4],
                                             const float (&row_sum)[kRowTiles][2], unsigned short *o,
                                             long long o_row_stride, int first_row, int tokens_q, int quad_lane,
                                             const float *v_scales, const float *v_mean) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
      if (row >= tokens_q)
        continue;
      const bool visible = row_sum[row_tile][half] > 0.0f;
      const float inverse_sum = visible ? 1.0f / row_sum[row_tile][half] : 0.0f;
#pragma unroll
      for (int tile = 0; tile < kOutputTiles; ++tile) {
        const int channel = tile * kMmaColumns + quad_lane * 2;
        float low = output[row_tile][tile][half * 2] * inverse_sum;
        float high = output[row_tile][tile][half * 2 + 1] * inverse_sum;
@DEQUANTIZE@@ADD_MEAN@        *reinterpret_cast<unsigned *>(o + row * o_row_stride + channel) = @PACK_OUTPUT@(low, high);
      }
    }
}

)";

constexpr std::string_view kDequantizeValues =
    R"(        low *= v_scales[channel] * kProbabilityScale; // psi_V^-1 and P's static scale
        high *= v_scales[channel + 1] * kProbabilityScale;
)";

constexpr std::string_view kAddValueMean =
    R"(        if (visible) { // V was smoothed: O = P~ (V - mean(V)) / l + mean(V)
          low += v_mean[channel];
          high += v_mean[channel + 1];
        }
)";

constexpr std::string_view kQDotKMean =
    R"(// ---- Epilogue: q . mean(K) per row, from the caller's Q ----
// K was smoothed (K - mean(K)), which shifted every score of row i by q_i . mean(K) / sqrt(d); the LSE adds it
// back. It is read from the caller's Q, not from Q's codes: the quantization error of q would be multiplied by
// mean(K), which can be large (a per-channel bias of K is exactly what smoothing removes).
@DECODE@
__device__ __forceinline__ void q_dot_k_mean(float (&dot)[kRowTiles][2], const unsigned short *q, long long q_row_stride,
                                             const float *k_mean, int first_row, int tokens_q, int quad_lane) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
      float sum = 0.0f;
      if (row < tokens_q) { // the four lanes of a quad share the row and split its channels
        const unsigned short *q_row = q + row * q_row_stride;
        for (int channel = quad_lane; channel < kHeadDim; channel += 4)
          sum += decode_input_element(q_row[channel]) * k_mean[channel];
      }
      dot[row_tile][half] = quad_sum(sum); // every lane takes part in the shuffle
    }
}

)";

constexpr std::string_view kDecodeF16 =
    R"(__device__ __forceinline__ float decode_input_element(unsigned short bits) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
  return value;
})";

constexpr std::string_view kDecodeBf16 =
    R"(__device__ __forceinline__ float decode_input_element(unsigned short bits) {
  return __uint_as_float(static_cast<unsigned>(bits) << 16); // bf16 is the top half of an f32
})";

constexpr std::string_view kWriteLse =
    R"(// ---- Epilogue: LSE_i = (m_i + log2 l_i) ln 2@CORRECTION_NOTE@ (natural log; -inf for a row with no visible key) ----
__device__ __forceinline__ void write_lse(const float (&row_max)[kRowTiles][2], const float (&row_sum)[kRowTiles][2],
                                          const float (&correction)[kRowTiles][2], float *lse, int first_row,
                                          int tokens_q, int quad_lane) {
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = first_row + row_tile * kMmaRows + half * kRowHalf;
      if (quad_lane != 0 || row >= tokens_q)
        continue;
      const float sum = row_sum[row_tile][half];
      lse[row] = sum > 0.0f ? (row_max[row_tile][half] + fast_log2(sum)) * kLn2 + correction[row_tile][half]
                            : negative_infinity();
    }
}

)";

} // namespace

std::string emitEpilogueSteps(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const bool f16_accumulator = plan.pv_path == PvPath::f16_accumulate_f16;
  const bool codes = plan.pv_path == PvPath::int8_per_block || plan.pv_path == PvPath::e4m3_accumulate_f32;
  std::string text;
  if (f16_accumulator)
    text += substitute(
        kCollectF16,
        {{"FLUSHED_NOTE", context.two_level ? " plus the flushed f32 part" : ""},
         {"FLUSHED_PARAMETER", context.two_level ? ",\n                                               const float "
                                                   "(&o_flushed)[kRowTiles][kOutputTiles][4]"
                                                 : ""},
         {"FLUSHED_ADD", context.two_level ? "        output[row_tile][tile][half * 2] += "
                                             "o_flushed[row_tile][tile][half * 2];\n"
                                             "        output[row_tile][tile][half * 2 + 1] += "
                                             "o_flushed[row_tile][tile][half * 2 + 1];\n"
                                           : ""}});
  else
    text += substitute(
        kCollectF32,
        {{"FLUSHED_NOTE", context.two_level ? ": the mma accumulator plus the flushed part" : ""},
         {"FLUSHED_PARAMETER", context.two_level ? ",\n                                               const float "
                                                   "(&o_flushed)[kRowTiles][kOutputTiles][4]"
                                                 : ""},
         {"FLUSHED_TERM", context.two_level ? " + o_flushed[row_tile][tile][i]" : ""}});
  const bool bf16_output = plan.input == schedules::InputType::bf16;
  text += substitute(kWriteOutput, {{"DEQUANT_NOTE", codes ? " x delta_V x P's scale" : ""},
                                    {"MEAN_NOTE", context.smoothed_v ? " + mean(V)" : ""},
                                    {"OUTPUT_TYPE", bf16_output ? "bf16" : "f16"},
                                    {"DEQUANTIZE", codes ? std::string(kDequantizeValues) : ""},
                                    {"ADD_MEAN", context.smoothed_v ? std::string(kAddValueMean) : ""},
                                    {"PACK_OUTPUT", bf16_output ? "pack_bf16x2" : "pack_f16x2"}});
  if (context.variant.epilogue.write_lse) {
    if (context.lse_correction) {
      std::string_view decode = plan.input == schedules::InputType::bf16 ? kDecodeBf16 : kDecodeF16;
      text += substitute(kQDotKMean, {{"DECODE", std::string(decode)}});
    }
    text += substitute(kWriteLse, {{"CORRECTION_NOTE", context.lse_correction ? " + q . mean(K) / sqrt(d)" : ""}});
  }
  return text;
}

} // namespace sage::codegen::detail
