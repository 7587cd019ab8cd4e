// The sm80 writer's output (Sm80KernelWriter): a Config of constants and the entry point of
// sage::device::sm80::attention_kernel<Config>. What each variant decides is checked where it takes effect: as
// static_asserts on the Config and on Geometry<Config> (sage/device/sm80/geometry.cuh), appended to the generated
// source and compiled by NVRTC's front end, which also instantiates the kernel template for that Config.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/schedules/Sm80Schedule.h"

#include "../support/DeviceLibraryCompile.h"
#include "TestVariants.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace sage;
using namespace sage::codegen;
using namespace sage::schedules;

namespace {

KernelSource generate(const AttentionVariant &variant, GpuArch arch = GpuArch::sm90a,
                      InputType input = InputType::f16) {
  return AttentionKernelGenerator::generate(variant, Sm80Schedule::full().plan(variant, arch, input));
}

// NVRTC's front end on the kernel followed by `assertions` (each `static_assert(...)` in sage::device::sm80 terms).
test::DeviceCompileResult check(const KernelSource &kernel, const std::string &assertions) {
  return test::compileWithDeviceLibrary(
      kernel.source + "\nusing namespace sage::device::sm80;\nusing G = Geometry<Config>;\n" + assertions + "\n",
      std::string(archName(kernel.arch)), true);
}

void require(const KernelSource &kernel, const std::string &assertions) {
  CAPTURE(kernel.name);
  const test::DeviceCompileResult result = check(kernel, assertions);
  INFO(result.log);
  CHECK(result.compiled);
}

} // namespace

TEST_CASE("sage-b d128: launch facts, the plan's tunables, int8 Q.K^T and f16 P.V with an f16 accumulator") {
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
  CHECK(kernel.uses_device_library);
  require(kernel, R"(
static_assert(Config::kHeadDim == 128 && Config::kBlockQ == 128 && Config::kBlockKv == 64);
static_assert(Config::kWarps == 4 && Config::kStages == 2 && G::kThreads == 128);
static_assert(Config::kQk == QkOperands::int8 && Config::kQuantizedQk);
static_assert(Config::kPv == PvPath::f16_accumulate_f16 && G::kF16Accumulator && G::kOutputRegisters == 2);
static_assert(G::kQkSteps == 4 && G::kPvSteps == 4 && G::kRowTiles == 2);
static_assert(!Config::kTwoLevel && !Config::kInterleavedColumns && !Config::kCausal && !Config::kWriteLse);
static_assert(!Config::kStagedKScales && Config::kKScalesPerBlock == 1); // one K scale per block
static_assert(Config::kStageOffset + Config::kStages * Config::kStageBytes <= )" +
                      std::to_string(plan.shared.total_bytes) + ");");
  // The check can fail: a false assertion is reported.
  CHECK_FALSE(check(kernel, "static_assert(Config::kTwoLevel);").compiled);
}

TEST_CASE("causal kernels skip blocks after the diagonal and start with the longest rows") {
  const KernelSource kernel = generate(test::presetVariant("sage-t", 64, MaskKind::causal));
  CHECK(kernel.name == "sage_attention_sage_t_d64_causal_f16_sm_90a");
  // per-token K scales vary inside a block: they travel with K through shared memory
  require(kernel, "static_assert(Config::kCausal && Config::kReverseQBlocks);\n"
                  "static_assert(Config::kStagedKScales && Config::kKScalesPerBlock == 64);");
}

TEST_CASE("8-bit P.V: interleaved S columns, transposed V codes, dequantized per channel at the end") {
  require(generate(test::presetVariant("sage-vb", 128)), R"(
static_assert(Config::kPv == PvPath::int8_per_block && G::kCodes && !G::kF16Accumulator);
static_assert(Config::kValues == ValueSource::workspace_codes && Config::kInterleavedColumns);
static_assert(G::kPvStepTokens == 32 && G::Columns::kv_token_of_column(1, 0) == 2); // 16h + 4c + 2s + b
static_assert(Config::kProbabilityCodeScale == 127.0f && Config::kProbabilityScale == 1.0f / 127.0f);)");
  require(generate(test::presetVariant("sage2-fp8", 128), GpuArch::sm89), R"(
static_assert(Config::kPv == PvPath::e4m3_accumulate_f32 && Config::kTwoLevel && Config::kFlushPeriod == 2);
static_assert(Config::kQScaleTokensPerGroup == 16);)");
}

TEST_CASE("exact: Q.K^T in the input's type with the softmax scale applied in the kernel, bf16 output") {
  require(generate(test::presetVariant("exact", 64), GpuArch::sm80, InputType::bf16), R"(
static_assert(Config::kQk == QkOperands::bf16 && !Config::kQuantizedQk);
static_assert(Config::kPv == PvPath::f16_accumulate_f32 && G::kOutputRegisters == 4);
static_assert(Config::kDomainFactorFromParams && Config::kBf16);
static_assert(Config::kValues == ValueSource::workspace_values); // bf16 V is converted to f16 by the prologue)");
}

TEST_CASE("LSE: written when asked, with the K-smoothing correction") {
  require(generate(test::presetVariant("sage-b", 128, MaskKind::none, true)),
          "static_assert(Config::kWriteLse && Config::kLseCorrection);");
  require(generate(test::presetVariant("exact", 128, MaskKind::none, true)),
          "static_assert(Config::kWriteLse && !Config::kLseCorrection); // K is not smoothed");
}

TEST_CASE("V smoothing and block-sparse masks") {
  AttentionVariant smoothed = test::presetVariant("sage-b", 64);
  smoothed.smooth_v = SmoothScope::sequence;
  require(generate(smoothed), "static_assert(Config::kSmoothedV && Config::kValues == ValueSource::workspace_values);");
  const KernelSource sparse = generate(test::presetVariant("sage-b", 128, MaskKind::block_sparse));
  CHECK(sparse.name == "sage_attention_sage_b_d128_block_sparse_f16_sm_90a");
  require(sparse, "static_assert(Config::kBlockSparse && !Config::kCausal);");
}

TEST_CASE("Q smoothing adds the prologue's delta_s of the CTA's Q block to S; int4 codes multiply as int8") {
  const AttentionVariant int4 = test::presetVariant("sage2-int4", 128);
  const KernelPlan plan = Sm80Schedule::full().plan(int4, GpuArch::sm90a, InputType::f16, Tunables{64, 64, 4, 3});
  // The CTA's 64 rows lie in one 128-row Q block of the variant (delta_s is per variant block); the softmax scale is
  // folded into Q.
  require(AttentionKernelGenerator::generate(int4, plan), R"(
static_assert(Config::kQk == QkOperands::int8 && Config::kQuantizedQk && Config::kBlockQ == 64);
static_assert(Config::kSmoothedQ && Config::kDeltaSRows == 128);
static_assert(!Config::kDomainFactorFromParams && Config::kDomainFactor == 1.0f);)");
  require(generate(test::presetVariant("sage2-int4-no-smooth-q", 128)), "static_assert(!Config::kSmoothedQ);");
}

TEST_CASE("FP4 by emulation: codes decoded to f16/bf16 tiles, P microscaled in registers, f32 P.V per block") {
  struct Expected {
    const char *preset;
    const char *operands;
    int group;
    bool two_level;
  };
  for (const Expected &expected :
       {Expected{"sage3-fp4", "f16", 16, true}, Expected{"sage3-fp4-direct-p", "f16", 16, false},
        Expected{"sage3-mxfp4", "bf16", 32, false}}) {
    CAPTURE(expected.preset);
    const AttentionVariant variant = test::presetVariant(expected.preset, 64, MaskKind::causal, true);
    const KernelPlan plan = Sm80Schedule::full().plan(variant, GpuArch::sm90a, InputType::f16);
    const KernelSource kernel = AttentionKernelGenerator::generate(variant, plan);
    require(kernel, std::string("static_assert(Config::kPv == PvPath::e2m1_decoded && G::kFp4);\n") +
                        "static_assert(Config::kQk == QkOperands::" + expected.operands + ");\n" +
                        "static_assert(Config::kFp4Group == " + std::to_string(expected.group) + ");\n" +
                        "static_assert(Config::kTwoLevelP == " + (expected.two_level ? "true" : "false") + ");\n" +
                        // The decode applied the microscales: no dequantization of S, no delta_V in the epilogue.
                        "static_assert(!Config::kQuantizedQk && !G::kCodes && Config::kSmoothedQ);\n"
                        "static_assert(Config::kKDecodedOffset + Config::kBlockKv * Config::kKRowBytes <= " +
                        std::to_string(plan.shared.total_bytes) + ");");
  }
}
