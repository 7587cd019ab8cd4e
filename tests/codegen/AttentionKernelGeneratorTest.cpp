// The attention kernel generator: what the text contains for each family of variants, and its launch facts.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/codegen/DeviceLibrary.h"
#include "sage/schedules/Sm80Schedule.h"

#include "TestVariants.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

namespace {

KernelSource generate(const AttentionVariant &variant, GpuArch arch = GpuArch::sm90a,
                      InputType input = InputType::f16) {
  return AttentionKernelGenerator::generate(variant, Sm80Schedule().plan(variant, arch, input));
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// The text NVRTC compiles: the device library's headers expanded in place.
std::string expanded(const KernelSource &kernel) { return expandDeviceIncludes(kernel.source); }

} // namespace

TEST_CASE("sage-b d128: name, launch facts, tunables at the top, the paper's steps in comments") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  const KernelPlan plan = Sm80Schedule().plan(variant, GpuArch::sm90a, InputType::f16);
  const KernelSource kernel = AttentionKernelGenerator::generate(variant, plan);
  CHECK(kernel.name == "sage_attention_sage_b_d128_f16_sm_90a");
  CHECK(kernel.entry_point == kernel.name);
  CHECK(kernel.block_dim == std::array<int, 3>{128, 1, 1});
  CHECK(kernel.dynamic_shared_bytes == plan.shared.total_bytes);
  CHECK(kernel.arch == GpuArch::sm90a);
  CHECK(kernel.grid.block_q == 128);
  CHECK(kernel.grid_description == plan.grid.description());

  const std::string &source = kernel.source;
  CHECK(contains(source, "struct SageAttentionParams"));
  CHECK(contains(source, "extern \"C\" __global__ void __launch_bounds__(kThreads, kMinBlocksPerMultiprocessor)\n" +
                             kernel.entry_point + "(const SageAttentionParams params)"));
  CHECK(contains(source, "constexpr int kHeadDim = 128;"));
  CHECK(contains(source, "constexpr int kBlockQ = 128;"));
  CHECK(contains(source, "constexpr int kBlockKv = 64;"));
  CHECK(contains(source, "constexpr int kWarps = 4;"));
  CHECK(contains(source, "constexpr int kStages = 2;"));
  for (const char *step : {"S_i^j", "m_i^j", "P~_i^j", "l_i^j", "O_i^j"})
    CHECK(contains(source, step));
  for (const char *name :
       {"q_fragment", "k_fragment", "score_accumulator", "p_fragment", "v_fragment", "o_accumulator"})
    CHECK(contains(expanded(kernel), name)); // v_fragment: in sage/device/sm80/value_steps_f16.cuh
  CHECK(contains(source, "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"));
  CHECK(contains(source, "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16"));
  // P.V's steps are the device library's, on the mma wrapper the kernel emitted.
  CHECK(kernel.uses_device_library);
  CHECK(contains(source, "#include \"sage/device/sm80/value_steps_f16.cuh\"\n"
                         "using ValueSteps = sage::device::sm80::F16ValueSteps<mma_m16n8k16_f16_f16>;"));
  CHECK(contains(source, "ValueSteps::multiply_p_v(state.o_accumulator, p_fragment"));
  CHECK(contains(expanded(kernel), "ldmatrix_x4_trans(v_fragment"));
  CHECK(contains(source, "cp.async.cg.shared.global"));
  CHECK(contains(source, "ex2.approx.ftz.f32"));
  CHECK(contains(source, "process_kv_block<false>"));
  CHECK(contains(source, "process_kv_block<true>"));
  CHECK_FALSE(contains(source, "@"));             // every template placeholder was filled
  CHECK_FALSE(contains(source, "two_level.cuh")); // one accumulator
  CHECK(contains(source, "using ScoreColumns = sage::device::sm80::ScoreColumns<false>;")); // tokens in order
  CHECK_FALSE(contains(expanded(kernel), "#include")); // every include is the device library's
  CHECK(std::count(source.begin(), source.end(), '{') == std::count(source.begin(), source.end(), '}'));
  CHECK_FALSE(contains(source, "write_lse(")); // no LSE unless the variant asks
}

TEST_CASE("causal kernels skip blocks after the diagonal and start with the longest rows") {
  const KernelSource kernel = generate(test::presetVariant("sage-t", 64, MaskKind::causal));
  CHECK(kernel.name == "sage_attention_sage_t_d64_causal_f16_sm_90a");
  CHECK(contains(kernel.source, "constexpr bool kCausal = true;"));
  CHECK(contains(kernel.source, "constexpr bool kReverseQBlocks = true;"));
  CHECK(contains(kernel.source, "diagonal_limit"));
  // per-token K scales vary inside a block: they travel with K through shared memory
  CHECK(contains(kernel.source, "cp_async_4("));
  CHECK(contains(kernel.source, "constexpr int kKScalesPerBlock = 64;"));
}

TEST_CASE("8-bit P.V: interleaved S columns, transposed V codes, dequantized per channel at the end") {
  const KernelSource vb_kernel = generate(test::presetVariant("sage-vb", 128));
  const std::string &vb = vb_kernel.source;
  CHECK(contains(vb, "#include \"sage/device/sm80/value_steps_codes.cuh\"\n"
                     "using ValueSteps = sage::device::sm80::CodeValueSteps<sage::device::sm80::CodeProduct::"
                     "s32_per_block, pack_s8x4, mma_m16n8k32_s8_s32>;"));
  CHECK(contains(vb, "unsigned pack_s8x4(float x0"));
  CHECK(contains(vb, "constexpr float kProbabilityCodeScale = 127.0f;"));
  CHECK(contains(vb, "using ScoreColumns = sage::device::sm80::ScoreColumns<true>;")); // sm80/tile_helpers.cuh
  CHECK(contains(expanded(vb_kernel), "16h + 4c + 2s + b"));
  CHECK(contains(vb, "v_scales[channel] * kProbabilityScale"));
  CHECK_FALSE(contains(expanded(vb_kernel), "ldmatrix_x4_trans"));

  const std::string fp8 = generate(test::presetVariant("sage2-fp8", 128), GpuArch::sm89).source;
  CHECK(contains(fp8, "using ValueSteps = sage::device::sm80::CodeValueSteps<sage::device::sm80::CodeProduct::f32, "
                      "pack_e4m3x4, mma_m16n8k32_e4m3_f32>;"));
  CHECK(contains(fp8, "#include \"sage/device/sm80/two_level.cuh\"\nusing sage::device::sm80::flush_accumulator;"));
  CHECK(contains(fp8, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"));
  CHECK(contains(fp8, "constexpr int kFlushPeriod = 2;"));
  CHECK(contains(fp8, "flush_accumulator(state.o_flushed, state.o_accumulator)"));
  CHECK(contains(fp8, "constexpr int kQScaleTokensPerGroup = 16;"));
}

TEST_CASE("exact: Q.K^T in the input's type with the softmax scale applied in the kernel, bf16 output") {
  const std::string exact = generate(test::presetVariant("exact", 64), GpuArch::sm80, InputType::bf16).source;
  CHECK(contains(exact, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
  CHECK(contains(exact, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
  CHECK(contains(exact, "params.softmax_scale * kLog2e"));
  CHECK(contains(exact, "pack_bf16x2(low, high)"));
  CHECK(contains(exact, "params.offsets.v_values")); // bf16 V is converted to f16 by the prologue
}

TEST_CASE("LSE: written when asked, with the K-smoothing correction") {
  const std::string source = generate(test::presetVariant("sage-b", 128, MaskKind::none, true)).source;
  CHECK(contains(source, "write_lse("));
  CHECK(contains(source, "q_dot_k_mean("));
  CHECK(contains(source, "params.offsets.k_mean"));
  const std::string exact = generate(test::presetVariant("exact", 128, MaskKind::none, true)).source;
  CHECK(contains(exact, "write_lse("));
  CHECK_FALSE(contains(exact, "q_dot_k_mean(")); // K is not smoothed
}

TEST_CASE("V smoothing and block-sparse masks") {
  AttentionVariant smoothed = test::presetVariant("sage-b", 64);
  smoothed.smooth_v = SmoothScope::sequence;
  const std::string source = generate(smoothed).source;
  CHECK(contains(source, "v_mean[channel]"));
  CHECK(contains(source, "params.offsets.v_values"));

  const KernelSource sparse = generate(test::presetVariant("sage-b", 128, MaskKind::block_sparse));
  CHECK(sparse.name == "sage_attention_sage_b_d128_block_sparse_f16_sm_90a");
  CHECK(contains(sparse.source, "kept_blocks[block] == 0"));
}

TEST_CASE("Q smoothing adds the prologue's delta_s of the CTA's Q block to S; int4 codes multiply as int8") {
  const AttentionVariant int4 = test::presetVariant("sage2-int4", 128);
  const KernelPlan plan = Sm80Schedule::full().plan(int4, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 4, 3});
  const std::string source = AttentionKernelGenerator::generate(int4, plan).source;
  CHECK(contains(source, "S accumulates in s32 (int4 codes, one per byte: multiplied as int8 codes)"));
  CHECK(contains(source, "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"));
  CHECK(contains(source, "add_q_mean_correction(scores, kv.delta_s + kv_begin, kv.delta_factor, position.quad_lane);"));
  // The CTA's 64 rows lie in one 128-row Q block of the variant (delta_s is per variant block).
  CHECK(contains(source, "(q_head_index * (size.padded_q / 128) + q_begin / 128) * size.padded_kv"));
  CHECK(contains(source, "kv.delta_factor = 1.0f;")); // the softmax scale is folded into Q
  // Added after dequantization and before the mask.
  const size_t dequantize = source.find("  dequantize_scores(scores, score_accumulator");
  const size_t correction = source.find("  add_q_mean_correction(scores");
  const size_t mask = source.find("    mask_scores(scores");
  REQUIRE(dequantize != std::string::npos);
  CHECK(dequantize < correction);
  CHECK(correction < mask);
  // No delta_s without Q smoothing.
  const AttentionVariant unsmoothed = test::presetVariant("sage2-int4-no-smooth-q", 128);
  const std::string unsmoothed_source =
      AttentionKernelGenerator::generate(unsmoothed,
                                         Sm80Schedule::full().plan(unsmoothed, GpuArch::sm90a, InputType::f16))
          .source;
  CHECK_FALSE(contains(unsmoothed_source, "add_q_mean_correction"));
}

TEST_CASE("FP4 by emulation: staged codes decoded to f16/bf16 tiles, P microscaled in registers, f32 P.V per block") {
  struct Expected {
    const char *preset;
    const char *mma;
    const char *steps; // the device library's FP4 steps on the kernel's 16-bit pack and mma wrappers
    int group;
    bool two_level;
  };
  for (const Expected &expected : {Expected{"sage3-fp4", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                            "Fp4Steps<pack_f16x2, mma_m16n8k16_f16_f32>", 16, true},
                                   Expected{"sage3-fp4-direct-p", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                            "Fp4Steps<pack_f16x2, mma_m16n8k16_f16_f32>", 16, false},
                                   Expected{"sage3-mxfp4", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                            "Fp4Steps<pack_bf16x2, mma_m16n8k16_bf16_f32>", 32, false}}) {
    CAPTURE(expected.preset);
    const AttentionVariant variant = test::presetVariant(expected.preset, 64, MaskKind::causal, true);
    const KernelPlan plan = Sm80Schedule::full().plan(variant, GpuArch::sm90a, InputType::f16);
    const KernelSource kernel = AttentionKernelGenerator::generate(variant, plan);
    const std::string &source = kernel.source;
    CHECK(contains(source, "//   S = Q.K^T: FP4 by emulation: e2m1 x "));
    CHECK(contains(source, expected.mma));
    CHECK_FALSE(contains(source, ".s8.s8.s32"));
    CHECK(contains(source, std::string("#include \"sage/device/sm80/fp4_steps.cuh\"\nusing Fp4Steps = "
                                       "sage::device::sm80::") +
                               expected.steps + ";"));
    CHECK(contains(source, "using ValueSteps = Fp4Steps;"));
    CHECK(contains(source, "constexpr int kFp4Group = " + std::to_string(expected.group) + ";"));
    CHECK(contains(source, std::string("constexpr bool kTwoLevelP = ") + (expected.two_level ? "true" : "false")));
    // fp4_steps.cuh brings the device library's microscaling; every include is the device library's.
    CHECK(kernel.uses_device_library);
    CHECK(contains(expanded(kernel), "namespace sage::device::fp4 {"));
    CHECK_FALSE(contains(expanded(kernel), "#include"));
    // Q_i decoded once; K_j and V_j^T decoded per stage, behind a barrier, before the Q.K^T mma reads them.
    CHECK(contains(source, "decode_fp4_tile<kBlockQ, kHeadDim>(position.shared_base + kQTileOffset"));
    const size_t decode_k =
        source.find("  Fp4Steps::decode_fp4_tile<kBlockKv, kHeadDim>(position.shared_base + kKDecodedOffset");
    const size_t decode_v =
        source.find("  Fp4Steps::decode_fp4_tile<kHeadDim, kBlockKv>(position.shared_base + kVDecodedOffset");
    const size_t multiply =
        source.find("  multiply_q_k(score_accumulator, state.q_fragment, position.shared_base + kKDecodedOffset");
    REQUIRE(decode_k != std::string::npos);
    REQUIRE(decode_v != std::string::npos);
    REQUIRE(multiply != std::string::npos);
    CHECK(decode_k < decode_v);
    CHECK(source.find("__syncthreads();", decode_v) < multiply);
    // S needs no dequantization (the decode applied the microscales); delta_s, the softmax, then P.
    CHECK(contains(source, "dequantize_scores(scores, score_accumulator, state.row_factor);"));
    CHECK(contains(source, "add_q_mean_correction(scores, kv.delta_s + kv_begin"));
    const size_t softmax = source.find("  online_softmax(scores, state.row_max");
    const size_t quantize = source.find("  ValueSteps::quantize_probabilities(p_fragment, p_row_scale, scores);");
    const size_t pv = source.find("  ValueSteps::multiply_p_v(state.o_accumulator, p_fragment, p_row_scale");
    REQUIRE(quantize != std::string::npos);
    CHECK(softmax < quantize);
    CHECK(quantize < pv);
    // The header scales the block's product by s_P1 when kTwoLevelP (checked above) says so.
    CHECK(contains(source, expected.two_level ? "// ---- Steps of O_i^j += s_P1 P^_i^j V^_j"
                                              : "// ---- Steps of O_i^j += P^_i^j V^_j"));
    CHECK(contains(expanded(kernel), "if constexpr (kTwoLevelP)\n"
                                     "            o_accumulator[row_tile][tile][i] += p_row_scale[row_tile][i / 2] * "
                                     "block_product[row_tile][i];"));
    // The epilogue divides by l only: the microscales were applied by the decodes.
    CHECK(contains(source, "position.quad_lane, nullptr, nullptr);"));
    CHECK_FALSE(contains(source, "v_scales[channel]"));
  }
}

TEST_CASE("a plan that does not belong to the variant is refused") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  const KernelPlan plan = Sm80Schedule().plan(test::presetVariant("sage-b", 64), GpuArch::sm80, InputType::f16);
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, plan), doctest::Contains("plan.head_dim"),
                       std::invalid_argument);
  KernelPlan foreign = Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16);
  foreign.schedule = "sm90.wgmma";
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, foreign), doctest::Contains("plan.schedule"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(
                           variant, Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16), InputType::bf16),
                       doctest::Contains("input"), std::invalid_argument);
}

TEST_CASE("kernel names are C identifiers") {
  AttentionVariant variant = test::presetVariant("sage-b", 64);
  variant.name = "My-Variant.v2";
  CHECK(generate(variant, GpuArch::sm86).name == "sage_attention_my_variant_v2_d64_f16_sm_86");
  // A name the IR refuses (a variant built directly) is taken through sourceSafe first: its escapes stay visible.
  variant.name = "My Variant (v2)!";
  CHECK(generate(variant, GpuArch::sm86).name == "sage_attention_my_20variant_20_28v2_29_21_d64_f16_sm_86");
}
