// SLA's ops (issue 13): the DSL's SLA programs print, parse back and lower to the variant they were built from;
// each verifier rule of predict_mask / linear_branch / sla_combine and of an SLA program fires with its message.
#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace sage;

namespace {

std::string replaced(std::string text, const std::string &find, const std::string &replace) {
  const size_t at = text.find(find);
  REQUIRE_MESSAGE(at != std::string::npos, "edit target not found: " << find);
  return text.replace(at, find.size(), replace);
}

std::string errorOf(const std::string &text) {
  try {
    ir::Program::parse(text, "sla.mlir");
  } catch (const ir::ProgramError &error) {
    return error.what();
  }
  return "";
}

} // namespace

TEST_CASE("every SLA preset round-trips through the textual IR and keeps its SLA fields") {
  for (const dsl::PresetInfo &info : dsl::slaPresets())
    for (int head_dim : {64, 128})
      for (bool lse : {false, true}) {
        const std::string name(info.name);
        CAPTURE(name);
        CAPTURE(head_dim);
        dsl::AttentionBuilder builder = *dsl::preset(info.name, head_dim);
        builder.lse(lse);
        const ir::Program program = builder.build();
        const std::string text = program.print();
        const ir::Program reparsed = ir::Program::parse(text, "roundtrip.mlir");
        CHECK(reparsed.print() == text);
        CHECK(reparsed.variant() == builder.describe());
        const AttentionVariant variant = program.variant();
        CHECK(variant.sla.enabled);
        CHECK(variant.mask.kind == MaskKind::block_sparse);
        CHECK(variant.block_q == 64);
        CHECK(variant.block_kv == 64);
        CHECK(variant.sla.critical_percent == 5.0);
        CHECK(variant.sla.negligible_percent == 10.0);
      }
}

TEST_CASE("the SLA IR names its steps and carries its attributes") {
  const dsl::AttentionBuilder builder = dsl::attention("s")
                                            .blocks(64, 64)
                                            .qk(dsl::f16_qk())
                                            .pv(dsl::f16(dsl::accum::f32))
                                            .sla(dsl::sla_spec(FeatureMap::relu, 12.5, 30.0));
  const std::string text = builder.build().print();
  for (const char *step : {"sage.predict_mask %q, %k critical(1.250000e+01) negligible(3.000000e+01)",
                           "sage.mask %s block_sparse", "sage.linear_branch %q, %k, %v over %block_classes phi relu",
                           "sage.sla_combine %o, proj(%o_linear)", "sage.write_o %o_sla"}) {
    CAPTURE(step);
    CHECK(text.find(step) != std::string::npos);
  }
  const AttentionVariant variant = ir::Program::parse(text).variant();
  CHECK(variant.sla.feature_map == FeatureMap::relu);
  CHECK(variant.sla.critical_percent == 12.5);
  CHECK(variant.sla.negligible_percent == 30.0);
  // Without SLA the variant's SLA fields stay at their defaults: programs without these ops are unchanged.
  CHECK_FALSE(dsl::preset("sage-b")->build().variant().sla.enabled);
}

TEST_CASE("an SLA variant takes no causal mask") {
  CHECK_THROWS_WITH_AS(dsl::preset("sla-f16", 128, MaskKind::causal)->describe(),
                       doctest::Contains("expected no_mask or block_sparse"), std::invalid_argument);
}

TEST_CASE("the SLA verifier rules") {
  const std::string valid = dsl::preset("sla-f16", 128)->build().print();
  REQUIRE(errorOf(valid).empty());
  struct Rule {
    std::string name;
    std::string text;
    const char *message;
  };
  const std::vector<Rule> rules = {
      {"k_h zero", replaced(valid, "critical(5.000000e+00)", "critical(0.0)"), "critical_percent (k_h) must lie in"},
      {"k_h over 100", replaced(valid, "critical(5.000000e+00)", "critical(101.0)"), "must lie in (0, 100]"},
      {"k_l negative", replaced(valid, "negligible(1.000000e+01)", "negligible(-1.0)"),
       "negligible_percent (k_l) must lie in [0, 100)"},
      {"k_h + k_l over 100", replaced(valid, "critical(5.000000e+00)", "critical(95.5)"), "must be at most 100"},
      {"pooling a smoothed operand",
       replaced(replaced(valid, "%v = sage.input v", "%v = sage.input v\n  %k2 = sage.smooth %k over sequence"),
                "sage.predict_mask %q, %k ", "sage.predict_mask %q, %k2 "),
       "its operands must be 'sage.input q' and 'sage.input k'"},
      {"pooling V", replaced(valid, "sage.predict_mask %q, %k ", "sage.predict_mask %q, %v "),
       "its operands must be 'sage.input q' and 'sage.input k'"},
      {"linear branch on quantized Q", replaced(valid, "sage.linear_branch %q,", "sage.linear_branch %q_f16,"),
       "its first three operands must be"},
      {"linear branch without M_c", replaced(valid, "over %block_classes", "over %q"),
       "its fourth operand must come from sage.predict_mask"},
      {"combine of the accumulator", replaced(valid, "sage.sla_combine %o,", "sage.sla_combine %o_accumulated,"),
       "its first operand must come from sage.normalize"},
      {"combine of the sparse part twice", replaced(valid, "proj(%o_linear)", "proj(%o)"),
       "its second operand must come from sage.linear_branch"},
      {"O written without the linear branch", replaced(valid, "sage.write_o %o_sla", "sage.write_o %o"),
       "its operand must come from sage.sla_combine"},
      {"no block_sparse mask", replaced(valid, "block_sparse", "causal"), "'sage.mask ... block_sparse'"},
      {"two linear branches",
       replaced(valid, "  sage.write_o",
                "  %o_linear2 = sage.linear_branch %q, %k, %v over %block_classes phi relu\n"
                "  sage.write_o"),
       "exactly one sage.predict_mask, sage.linear_branch and sage.sla_combine each, found 1, 2 and 1"},
      {"unknown feature map", replaced(valid, "phi softmax", "phi tanh"), "to be one of: softmax, elu_plus_one, relu"},
  };
  for (const Rule &rule : rules) {
    CAPTURE(rule.name);
    const std::string error = errorOf(rule.text);
    CHECK_MESSAGE(error.find(rule.message) != std::string::npos, error);
  }
}
