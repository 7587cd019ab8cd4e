// FP4 by emulation (PvPath::e2m1_decoded, the legalized program on a target without the block-scaled mma): the
// decode of staged e2m1 codes x microscales into 16-bit tiles in shared memory, P~'s microscaling in registers
// (reference::quantizeProbabilities' f32 steps) and the P.V product over the decoded V_j^T. The arithmetic on single
// values is the device library's sage/device/fp4/microscaling.cuh, host-tested against sage::numerics.
#include "KernelText.h"

#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/PtxEmitters.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace sage::codegen::detail {
namespace {

constexpr std::string_view kDecode =
    R"(// ---- FP4 emulation: shared-memory words and the 16-bit type the codes decode to ----
namespace fp4 = sage::device::fp4;

__device__ __forceinline__ unsigned load_shared_u32(unsigned address) {
  unsigned value;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(value) : "r"(address));
  return value;
}

__device__ __forceinline__ void store_shared_v4(unsigned address, unsigned x, unsigned y, unsigned z, unsigned w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(x), "r"(y), "r"(z), "r"(w));
}

// Two decoded values (exactly representable) as the mma's @DECODED@x2 operand register; `low` in bits 0-15
__device__ __forceinline__ unsigned pack_decoded(float low, float high) { return @PACK@(low, high); }

// ---- Step: e2m1 codes x microscales -> @DECODED@ tiles in shared memory (exact: the legalization's sage.decode) ----
// A tile of kRows x kElements codes as copy_tile_async staged it (kElements / 2 bytes per row, swizzled), its scales
// one byte per kFp4Group elements, `scale_row_stride` bytes between rows (shared memory or the workspace). Each
// thread decodes one code word at a time: 8 elements, one 16-byte chunk of the decoded (swizzled) row.
template <int kRows, int kElements>
__device__ __forceinline__ void decode_fp4_tile(unsigned decoded_tile, unsigned code_tile, const unsigned char *scales,
                                                int scale_row_stride) {
  constexpr int kWordsPerRow = kElements / 8;
  constexpr int kCodeRowChunks = kElements / 2 / kChunkBytes;
  constexpr int kDecodedRowChunks = kElements * 2 / kChunkBytes;
  constexpr int kWordsPerChunk = kChunkBytes / 4;
  for (int word = static_cast<int>(threadIdx.x); word < kRows * kWordsPerRow; word += kThreads) {
    const int row = word / kWordsPerRow, column = word % kWordsPerRow;
    const unsigned codes = load_shared_u32(code_tile + swizzled_offset<kCodeRowChunks>(row, column / kWordsPerChunk) +
                                           (column % kWordsPerChunk) * 4);
    const float scale = fp4::microscale_value(scales[row * scale_row_stride + column * 8 / kFp4Group], kFp4Group);
    float values[8];
    fp4::decode_e2m1x8(codes, scale, values);
    store_shared_v4(decoded_tile + swizzled_offset<kDecodedRowChunks>(row, column), pack_decoded(values[0], values[1]),
                    pack_decoded(values[2], values[3]), pack_decoded(values[4], values[5]),
                    pack_decoded(values[6], values[7]));
  }
}

)";

constexpr std::string_view kQuantizeProbabilities =
    R"(// ---- Step: P~_i^j microscaled in registers (Algorithm 1, line 10; reference::quantizeProbabilities) ----
// @P_NOTE@
// Two adjacent n8 tiles of S hold tokens 16s .. 16s + 15 of the block (columns 2t, 2t + 1 of each, rows g and
// g + 8), so a group of kFp4Group tokens is kGroupTiles tiles spread over the 4 lanes of a quad: its amax is a quad
// max. Each P~ is replaced by its code's value x the group's scale (exact in @DECODED@), then packed as the A fragment
// of the P.V mma (m16n8k16 over those 16 tokens). p_row_scale gets s_P1 (1 for direct P).
__device__ __forceinline__ void quantize_probabilities(unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                                       float (&p_row_scale)[kRowTiles][2],
                                                       float (&probabilities)[kRowTiles][kScoreTiles][4]) {
  constexpr int kGroupTiles = kFp4Group / kMmaColumns;
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      fp4::RowScale row{1.0f, 1.0f};
      if constexpr (kTwoLevelP) { // s_P1 = rowmax(P~) / (448 x 6) over this S tile's row
        float row_max = 0.0f;
#pragma unroll
        for (int tile = 0; tile < kScoreTiles; ++tile)
          row_max = fmaxf(row_max,
                          fmaxf(probabilities[row_tile][tile][half * 2], probabilities[row_tile][tile][half * 2 + 1]));
        row = fp4::probability_row_scale(quad_max(row_max));
      }
      p_row_scale[row_tile][half] = row.scale;
#pragma unroll
      for (int group = 0; group < kScoreTiles / kGroupTiles; ++group) {
        float amax = 0.0f;
#pragma unroll
        for (int tile = group * kGroupTiles; tile < (group + 1) * kGroupTiles; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            float &x = probabilities[row_tile][tile][half * 2 + column];
            if constexpr (kTwoLevelP)
              x = fp4::multiply_rn(x, row.inverse);
            amax = fp4::max_magnitude(amax, x);
          }
        const unsigned scale_code = fp4::microscale_code(quad_max(amax), kFp4Group);
        const float scale = fp4::microscale_value(scale_code, kFp4Group);
        const float inverse = fp4::microscale_inverse(scale_code, kFp4Group);
#pragma unroll
        for (int tile = group * kGroupTiles; tile < (group + 1) * kGroupTiles; ++tile)
#pragma unroll
          for (int column = 0; column < 2; ++column) {
            float &x = probabilities[row_tile][tile][half * 2 + column];
            x = fp4::quantize_probability(x, scale, inverse);
          }
      }
    }
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int step = 0; step < kPvSteps; ++step) {
      const float(&first)[4] = probabilities[row_tile][2 * step];
      const float(&second)[4] = probabilities[row_tile][2 * step + 1];
      p_fragment[row_tile][step][0] = pack_decoded(first[0], first[1]);   // row g, tokens 2t, 2t + 1
      p_fragment[row_tile][step][1] = pack_decoded(first[2], first[3]);   // row g + 8
      p_fragment[row_tile][step][2] = pack_decoded(second[0], second[1]); // row g, tokens 8 + 2t, 9 + 2t
      p_fragment[row_tile][step][3] = pack_decoded(second[2], second[3]); // row g + 8
    }
}

)";

constexpr std::string_view kMultiply = R"(// ---- Step: O_i^j += @ROW_SCALE@(P^_i^j V^_j) ----
// V_j^T decoded (channel-major, kVRowBytes per channel) is the B operand's own layout: plain ldmatrix, one 8x8 matrix
// per 8 tokens of 8 channels; one x4 covers two k steps of one n8 channel tile. @ACCUMULATION_NOTE@
__device__ __forceinline__ void multiply_p_v(float (&o_accumulator)[kRowTiles][kOutputTiles][4],
                                             const unsigned (&p_fragment)[kRowTiles][kPvSteps][4],
                                             const float (&p_row_scale)[kRowTiles][2], unsigned v_tile, int lane) {
  constexpr int kRowChunks = kVRowBytes / kChunkBytes; // one chunk = 8 tokens
  static_assert(kPvSteps % 2 == 0, "one ldmatrix.x4 covers two k steps");
  const unsigned lane_offset = swizzled_offset<kRowChunks>(lane % kLdmatrixRows, lane / kLdmatrixRows);
#pragma unroll
  for (int tile = 0; tile < kOutputTiles; ++tile) {
    float block_product[kRowTiles][4];
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        block_product[row_tile][i] = 0.0f;
#pragma unroll
    for (int pair = 0; pair < kPvSteps / 2; ++pair) {
      unsigned v_fragment[4];
      ldmatrix_x4(v_fragment, tile_address(v_tile, lane_offset, tile * kMmaColumns * kVRowBytes, pair * 4));
#pragma unroll
      for (int row_tile = 0; row_tile < kRowTiles; ++row_tile) {
        @PV_MMA@(block_product[row_tile], p_fragment[row_tile][2 * pair], v_fragment[0], v_fragment[1]);
        @PV_MMA@(block_product[row_tile], p_fragment[row_tile][2 * pair + 1], v_fragment[2], v_fragment[3]);
      }
    }
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        o_accumulator[row_tile][tile][i] += @SCALED_PRODUCT@;
  }
}

)";

} // namespace

std::string emitFp4DecodeSteps(const KernelContext &context) {
  const DeviceHeader *header = findDeviceHeader("sage/device/fp4/microscaling.cuh");
  if (!header)
    throw std::logic_error("attention kernel generator: the device library lacks sage/device/fp4/microscaling.cuh");
  const bool bf16 = context.plan.qk_mma.a == ElementType::bf16;
  std::string text = "// ---- FP4 microscaling (from the device library: sage/device/fp4/microscaling.cuh) ----\n";
  text += expandDeviceIncludes(header->text);
  text += "\n";
  text += substitute(kDecode, {{"DECODED", bf16 ? "bf16" : "f16"}, {"PACK", bf16 ? "pack_bf16x2" : "pack_f16x2"}});
  return text;
}

std::string emitFp4ValueSteps(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const bool bf16 = plan.pv_mma.a == ElementType::bf16;
  const std::string format = plan.fp4_scale_group == 32 ? "MXFP4: 1x32 groups, ue8m0 scales"
                                                        : "NVFP4: 1x16 groups, "
                                                          "ue4m3 scales";
  std::string text = substitute(
      kQuantizeProbabilities,
      {{"P_NOTE", plan.fp4_two_level_p
                      ? "Two-level (" + format + "): s_P1 = rowmax(P~) / 2688 per row, then P~ / s_P1 microscaled."
                      : "Direct (" + format + "): P~ itself microscaled."},
       {"DECODED", bf16 ? "bf16" : "f16"}});
  text += substitute(
      kMultiply, {{"ROW_SCALE", plan.fp4_two_level_p ? "s_P1 " : ""},
                  {"ACCUMULATION_NOTE", plan.fp4_two_level_p ? "The block's product (f32) is scaled by s_P1 per row, "
                                                               "then added into O."
                                                             : "The block's product (f32) is added into O."},
                  {"PV_MMA", mmaFunctionName(plan.pv_mma)},
                  {"SCALED_PRODUCT", plan.fp4_two_level_p ? "p_row_scale[row_tile][i / 2] * block_product[row_tile][i]"
                                                          : "block_product[row_tile][i]"}});
  return text;
}

std::string fp4Constants(const KernelContext &context) {
  const schedules::KernelPlan &plan = context.plan;
  const schedules::SharedMemoryLayout &shared = plan.shared;
  return fmt::format(
      R"(// ---- FP4 emulation: staged codes and scales, decoded tiles (bytes) ----
constexpr int kFp4Group = {group}; // elements per microscale ({format})
constexpr bool kTwoLevelP = {two_level}; // P: s_P1 = rowmax(P~) / 2688 per row before the microscales
constexpr int kQCodeRowBytes = {q_code_row}; // e2m1 codes, two per byte
constexpr int kKCodeRowBytes = {k_code_row};
constexpr int kVCodeRowBytes = {v_code_row}; // V_j^T: one row per channel
constexpr int kQScaleRowBytes = {q_scale_row};
constexpr int kKScaleRowBytes = {k_scale_row};
constexpr int kQCodesOffset = {q_codes}; // Q_i's codes and scales share the decoded tiles' bytes until Q_i is decoded
constexpr int kQScalesOffset = {q_scales};
constexpr int kKDecodedOffset = {k_decoded}; // K_j decoded [b_kv, d]
constexpr int kVDecodedOffset = {v_decoded}; // V_j^T decoded [d, b_kv]
constexpr int kKCodesOffset = {k_codes}; // within a stage
constexpr int kKScalesOffset = {k_scales}; // within a stage
constexpr int kVCodesOffset = {v_codes}; // within a stage
)",
      fmt::arg("group", plan.fp4_scale_group),
      fmt::arg("format", plan.fp4_scale_group == 32 ? "MXFP4, ue8m0" : "NVFP4, ue4m3"),
      fmt::arg("two_level", plan.fp4_two_level_p), fmt::arg("q_code_row", shared.q_codes.row_bytes),
      fmt::arg("k_code_row", shared.k.row_bytes), fmt::arg("v_code_row", shared.v.row_bytes),
      fmt::arg("q_scale_row", shared.q_scales.row_bytes), fmt::arg("k_scale_row", shared.k_scales.row_bytes),
      fmt::arg("q_codes", shared.q_codes.offset), fmt::arg("q_scales", shared.q_scales.offset),
      fmt::arg("k_decoded", shared.decoded_k.offset), fmt::arg("v_decoded", shared.decoded_v.offset),
      fmt::arg("k_codes", shared.k.offset), fmt::arg("k_scales", shared.k_scales.offset),
      fmt::arg("v_codes", shared.v.offset));
}

} // namespace sage::codegen::detail
