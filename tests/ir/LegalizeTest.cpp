// The legalization pass, text in and text out: which mma operands each target decodes, what the rewritten
// program says, and that the rewrite is exact (the CPU reference of the legalized program equals the original's).
#include "sage/ir/Legalize.h"
#include "sage/dsl/Presets.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

using namespace sage;

namespace {

ir::Program presetProgram(const char *name, int head_dim = 128) {
  return dsl::preset(name, head_dim, MaskKind::none)->build();
}

bool contains(const std::string &text, const std::string &piece) { return text.find(piece) != std::string::npos; }

// The variant with the mma operand types put back to the quantizers' (all a legalization may change).
AttentionVariant withQuantizedMmaTypes(AttentionVariant variant) {
  variant.qk.a = variant.q.dtype;
  variant.qk.b = variant.k.dtype;
  variant.pv.a = variant.p.dtype;
  variant.pv.b = variant.v.dtype;
  return variant;
}

} // namespace

TEST_CASE("sm_90a has no FP4 mma: NVFP4 operands decode to f16 and multiply with f32 accumulation") {
  const ir::Program original = presetProgram("sage3-fp4");
  const ir::Program legalized = ir::legalizeForTarget(original, "sm_90a");
  const std::string text = legalized.print();
  CAPTURE(text);
  for (const char *piece :
       {"%q_decoded_f16 = sage.decode %q_e2m1 to f16", "%k_decoded_f16 = sage.decode %k_e2m1 to f16",
        "sage.mma %q_decoded_f16, %k_decoded_f16 -> f32", "%p_decoded_f16 = sage.decode %p_e2m1 to f16",
        "%v_decoded_f16 = sage.decode %v_e2m1 to f16", "sage.mma %p_decoded_f16, %v_decoded_f16 -> f32",
        "sage.q_mean_correction", "two_level"})
    CHECK(contains(text, piece));
  const AttentionVariant variant = legalized.variant();
  CHECK(variant.qk == MatmulSpec{ElementType::f16, ElementType::f16, AccumulatorType::f32});
  CHECK(variant.pv == MatmulSpec{ElementType::f16, ElementType::f16, AccumulatorType::f32});
  // Only the mma operand types change: the quantizers (codes, scales, two-level P) are the original's.
  CHECK(withQuantizedMmaTypes(variant) == original.variant());
  // The printed result parses back to itself, and legalizing again changes nothing.
  CHECK(ir::Program::parse(text, "legalized.mlir").print() == text);
  CHECK(ir::legalizeForTarget(legalized, "sm_90a").print() == text);
}

TEST_CASE("MXFP4 decodes to bf16 (a power-of-two scale needs f32's exponent range)") {
  const std::string text = ir::legalizeForTarget(presetProgram("sage3-mxfp4"), "sm_90a").print();
  CHECK(contains(text, "sage.decode %q_e2m1 to bf16"));
  CHECK(contains(text, "sage.mma %p_decoded_bf16, %v_decoded_bf16 -> f32"));
}

TEST_CASE("targets with the block-scaled FP4 mma keep FP4; INT4 decodes to int8 where the target lacks it") {
  const ir::Program fp4 = presetProgram("sage3-fp4");
  for (const char *arch : {"sm_120a", "sm_120f"}) {
    CAPTURE(arch);
    CHECK(ir::legalizeForTarget(fp4, arch).print() == fp4.print());
  }
  for (const char *arch : {"sm_100a", "sm_100f"}) { // tcgen05's FP4 is not lowered to: decoded as on Hopper
    CAPTURE(arch);
    CHECK(contains(ir::legalizeForTarget(fp4, arch).print(), "sage.decode %q_e2m1 to f16"));
  }
  const ir::Program int4 = presetProgram("sage2-int4");
  for (const char *arch : {"sm_80", "sm_86", "sm_89"}) {
    CAPTURE(arch);
    CHECK(ir::legalizeForTarget(int4, arch).print() == int4.print());
  }
  for (const char *arch : {"sm_90a", "sm_120a"}) {
    CAPTURE(arch);
    const ir::Program legalized = ir::legalizeForTarget(int4, arch);
    const std::string text = legalized.print();
    CHECK(contains(text, "sage.decode %q_int4 to int8"));
    CHECK(contains(text, "sage.mma %q_decoded_int8, %k_decoded_int8 -> s32"));
    CHECK(legalized.variant().qk == MatmulSpec{ElementType::int8, ElementType::int8, AccumulatorType::s32});
    CHECK(legalized.variant().pv == int4.variant().pv); // e4m3 P.V is native from sm_89 on: untouched
  }
}

TEST_CASE("programs without FP4 or INT4 are unchanged on every target") {
  for (const dsl::PresetInfo &info : dsl::presets()) {
    const ir::Program program = dsl::preset(info.name, 64, MaskKind::causal)->lse().build();
    for (const std::string &arch : ir::legalizationTargets()) {
      const std::string name(info.name);
      CAPTURE(name);
      CAPTURE(arch);
      CHECK(ir::legalizeForTarget(program, arch).print() == program.print());
    }
  }
}

TEST_CASE("hand-written legalized IR parses; an unknown target is refused by name") {
  const std::string text = ir::legalizeForTarget(presetProgram("sage3-fp4", 64), "sm_90a").print();
  CHECK(ir::Program::parse(text, "hand.mlir").variant().qk.a == ElementType::f16);
  CHECK_THROWS_WITH_AS(ir::legalizeForTarget(presetProgram("sage3-fp4"), "sm_75"),
                       doctest::Contains("unknown target 'sm_75'; expected one of sm_80"), std::invalid_argument);
}

TEST_CASE("the rewrite is exact: the CPU reference of the legalized program equals the original's") {
  using namespace sage::reference;
  const HostTensor q = randomTensor(1, 1, 160, 64, StorageType::f16, Layout::hnd, {91});
  const HostTensor k = randomTensor(1, 1, 160, 64, StorageType::f16, Layout::hnd, {92, 0.0, 1.0, 2.0});
  const HostTensor v = randomTensor(1, 1, 160, 64, StorageType::f16, Layout::hnd, {93});
  for (const char *name : {"sage3-fp4", "sage3-fp4-direct-p", "sage3-mxfp4", "sage2-int4"}) {
    CAPTURE(name);
    const ir::Program original = dsl::preset(name, 64, MaskKind::causal)->lse().build();
    const ir::Program legalized = ir::legalizeForTarget(original, "sm_90a");
    REQUIRE(legalized.print() != original.print());
    const AttentionResult before = runReference(original.variant(), q, k, v);
    const AttentionResult after = runReference(legalized.variant(), q, k, v);
    CHECK(after.output == before.output);
    CHECK(after.lse == before.lse);
  }
}
