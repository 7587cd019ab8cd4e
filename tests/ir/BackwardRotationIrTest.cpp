// The backward program's rotation (issue 25): `rotation_seed` on sage.bwd_quantize of Q and K prints, parses and
// lowers to the variant's quantizer specs (sagebwd-rot), and the verifier refuses every other use with a message
// naming the attribute, at the op's line.
#include "sage/dsl/AttentionBackward.h"
#include "sage/ir/BackwardProgram.h"

#include "IrEdits.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace sage;

namespace {

using namespace sage::ir_test;

// sagebwd-rot (K smoothed, Q and K rotated with seed 0), not causal: sagebwd's program without its mask, one line
// shorter (the cases' lines count that way).
std::string rotatedProgram() {
  return applyEdits(kSageBwdCausalProgram,
                    {{"@b", "@r"},
                     {"  %s_masked = sage.bwd_mask %s causal\n", ""},
                     {"%s_masked, %lse", "%s, %lse"},
                     {"%q to int8 per_block {group_tokens = 64 : i64}",
                      "%q to int8 per_block {group_tokens = 64 : i64, rotation_seed = 0 : i64}"},
                     {"%k_smoothed to int8 per_block {group_tokens = 64 : i64}",
                      "%k_smoothed to int8 per_block {group_tokens = 64 : i64, rotation_seed = 0 : i64}"}});
}

const std::string kQSeed = "%q_int8 = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64, rotation_seed";
const std::string kDoInt8 = "%do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 64 : i64}";

const std::vector<RuleCase> kRules = {
    {"dO rotated",
     {{kDoInt8,
       "%do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 64 : i64, rotation_seed = 0 : i64}"}},
     "rotation_seed rotates Q and K along head_dim",
     15},
    {"P rotated",
     {{"%p_int8 = sage.bwd_quantize %p to int8 per_block", "%p_int8 = sage.bwd_quantize %p to int8 per_block "
                                                           "{rotation_seed = 0 : i64}"}},
     "P cannot be rotated",
     14},
    {"a cast rotated",
     {{"%q_int8 = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64, rotation_seed = 0 : i64}",
       "%q_int8 = sage.bwd_quantize %q to f16 none {rotation_seed = 0 : i64}"}},
     "a cast to f16 has no scale to protect",
     10},
    {"a negative seed", {{kQSeed + " = 0", kQSeed + " = -1"}}, "rotation_seed must lie in [0, 2^32 - 1], got -1", 10},
    {"a seed beyond 32 bits",
     {{kQSeed + " = 0", kQSeed + " = 4294967296"}},
     "rotation_seed must lie in [0, 2^32 - 1]",
     10},
    {"Q and K with different seeds",
     {{kQSeed + " = 0", kQSeed + " = 7"}},
     "Q and K are rotated with one rotation_seed wherever they meet",
     11},
    {"K rotated, Q not",
     {{kQSeed + " = 0 : i64}", "%q_int8 = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64}"}},
     "K's rotation_seed is 0, Q's none",
     11},
    {"dK's Q unrotated beside S's rotated Q",
     {{"%dk = sage.bwd_mma %ds_int8, %q_int8 -> s32",
       "%q_plain = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64}\n"
       "  %dk = sage.bwd_mma %ds_int8, %q_plain -> s32"}},
     "Q's rotation_seed is none, Q's 0",
     23},
    {"a head_dim without a Hadamard matrix",
     {{"head_dim(128)", "head_dim(96)"}},
     "head_dim must be a power of two in [16, 256], got 96",
     10},
};

} // namespace

TEST_CASE("the rotated backward program parses, prints as it was read and lowers to sagebwd-rot") {
  const ir::BackwardProgram program = ir::BackwardProgram::parse(rotatedProgram(), "rotated.mlir");
  BackwardVariant expected = dsl::backwardPreset("sagebwd-rot", 128)->describe();
  expected.name = "r";
  CHECK(program.variant() == expected);
  CHECK(program.print() == rotatedProgram());
  using P = BackwardProduct;
  const BackwardVariant variant = program.variant();
  for (const QuantizerSpec *spec : {&variant.product(P::s).lhs, &variant.product(P::s).rhs, &variant.product(P::dq).rhs,
                                    &variant.product(P::dk).rhs})
    CHECK(spec->rotation_seed == std::optional<uint32_t>(0));
  for (const QuantizerSpec *spec :
       {&variant.product(P::dp).lhs, &variant.product(P::dp).rhs, &variant.product(P::dv).lhs,
        &variant.product(P::dv).rhs, &variant.product(P::dq).lhs, &variant.product(P::dk).lhs})
    CHECK_FALSE(spec->rotation_seed.has_value());
  // The seed is part of the program: another seed is another fingerprint.
  const std::string seven =
      applyEdits(rotatedProgram(), {{kQSeed + " = 0", kQSeed + " = 7"},
                                    {"per_block {group_tokens = 64 : i64, rotation_seed = 0 : i64}\n"
                                     "  %s",
                                     "per_block {group_tokens = 64 : i64, rotation_seed = 7 : i64}\n"
                                     "  %s"}});
  const ir::BackwardProgram reseeded = ir::BackwardProgram::parse(seven, "seven.mlir");
  CHECK(reseeded.variant().product(P::s).rhs.rotation_seed == std::optional<uint32_t>(7));
  CHECK(reseeded.fingerprint() != program.fingerprint());
}

TEST_CASE("each backward rotation rule reports its message, naming rotation_seed, at its line") {
  checkBackwardRules(kRules, rotatedProgram(), "rotation_seed");
}

TEST_CASE("the DSL's rotate(): every Q and K quantizer, one seed, through the verifier") {
  const dsl::AttentionBackwardBuilder builder =
      dsl::attention_backward("mine").head_dim(64).mask(MaskKind::causal).rotate(12345);
  const ir::BackwardProgram program = builder.build();
  CHECK(program.variant() == builder.describe());
  CHECK(program.print().find("rotation_seed = 12345 : i64") != std::string::npos);
  CHECK(program.variant().product(BackwardProduct::dk).rhs.rotation_seed == std::optional<uint32_t>(12345));
  // Q and K quantized once each: S, dQ and dK share the rotated codes.
  const std::string text = program.print();
  size_t rotated = 0;
  for (size_t at = text.find("rotation_seed"); at != std::string::npos; at = text.find("rotation_seed", at + 1))
    ++rotated;
  CHECK(rotated == 2);
  // The verifier's head_dim rule, through the DSL.
  CHECK_THROWS_WITH_AS(dsl::attention_backward("odd").head_dim(96).rotate().build(),
                       doctest::Contains("head_dim must be a power of two"), ir::ProgramError);
  // Nothing to rotate without quantizers.
  CHECK_THROWS_WITH_AS(dsl::attention_backward("exact").full_precision().rotate().build(),
                       doctest::Contains("rotate: a full-precision backward quantizes nothing"), std::invalid_argument);
}

TEST_CASE("the rotated presets pair: sagebwd-rot rotates, its forward presets pick it") {
  CHECK(dsl::backwardPreset("sagebwd-rot")->describe().product(BackwardProduct::s).lhs.rotation_seed ==
        std::optional<uint32_t>(dsl::kDefaultRotationSeed));
  CHECK_FALSE(dsl::backwardPreset("sagebwd")->describe().product(BackwardProduct::s).lhs.rotation_seed.has_value());
  CHECK(dsl::backwardPresetForward("sagebwd-rot") == "sagebwd");
  for (const dsl::PresetInfo &info : dsl::rotatedPresets())
    CHECK(dsl::backwardPresetFor(info.name) == "sagebwd-rot");
  CHECK(dsl::backwardPresetFor("sage-b") == "sagebwd");
  CHECK(dsl::backwardPresetFor("sage2-fp8") == "sagebwd");
}
