// The attention kernel generator: the plans it refuses and the names it gives. What the sm80 kernels compute for each
// family of variants is checked by Sm80KernelConfigTest.cpp (the Config through NVRTC), NvrtcCompileTest.cpp (every
// preset through ptxas) and the GPU tests.
#include "sage/codegen/AttentionKernelGenerator.h"
#include "sage/schedules/Sm80Schedule.h"

#include "TestVariants.h"

#include <doctest/doctest.h>

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

} // namespace

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

TEST_CASE("the sm80 writer refuses a plan it cannot write, naming the field") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  KernelPlan block_scaled = Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16);
  block_scaled.pv_path = PvPath::e2m1_block_scaled; // the sm120 schedule's
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, block_scaled), doctest::Contains("plan.pv_path"),
                       std::invalid_argument);
  KernelPlan incomplete = Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16);
  incomplete.threads = 0;
  CHECK_THROWS_WITH_AS(AttentionKernelGenerator::generate(variant, incomplete), doctest::Contains("plan"),
                       std::invalid_argument);
}

TEST_CASE("kernel names are C identifiers") {
  AttentionVariant variant = test::presetVariant("sage-b", 64);
  variant.name = "My-Variant.v2";
  CHECK(generate(variant, GpuArch::sm86).name == "sage_attention_my_variant_v2_d64_f16_sm_86");
  // A name the IR refuses (a variant built directly) is taken through sourceSafe first: its escapes stay visible.
  variant.name = "My Variant (v2)!";
  CHECK(generate(variant, GpuArch::sm86).name == "sage_attention_my_20variant_20_28v2_29_21_d64_f16_sm_86");
}
