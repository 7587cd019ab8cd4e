// Packed variable-length batches in the IR (issue 28): the `packed_sequences` keyword on sage.attention prints, parses
// back and lowers to AttentionVariant::packed_sequences; dense programs print as before; the verifier refuses what
// packed batches cannot be (SLA, block_sparse masks), and the DSL and packedSequencesOf refuse the same.
#include "IrEdits.h"
#include "sage/dsl/Presets.h"
#include "sage/ir/Legalize.h"
#include "sage/ir/Program.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;

namespace {

std::vector<dsl::PresetInfo> nonSlaPresets() {
  std::vector<dsl::PresetInfo> all = dsl::presets();
  for (const auto *table : {&dsl::referenceOnlyPresets(), &dsl::rotatedPresets()})
    all.insert(all.end(), table->begin(), table->end());
  return all;
}

std::string errorOf(const std::string &text) {
  try {
    (void)ir::Program::parse(text, "packed.mlir");
  } catch (const ir::ProgramError &error) {
    return error.what();
  }
  return "";
}

} // namespace

TEST_CASE("every preset on packed sequences round-trips through the textual IR") {
  for (const dsl::PresetInfo &info : nonSlaPresets())
    for (MaskKind mask : {MaskKind::none, MaskKind::causal})
      for (bool lse : {false, true}) {
        const std::string name(info.name);
        CAPTURE(name);
        CAPTURE(lse);
        dsl::AttentionBuilder builder = *dsl::preset(info.name, 128, mask);
        builder.lse(lse);
        const ir::Program dense = builder.build();
        builder.packed_sequences();
        const ir::Program packed = builder.build();
        const std::string text = packed.print();
        CHECK(text.find("block_kv(64) packed_sequences {") != std::string::npos);
        const ir::Program reparsed = ir::Program::parse(text, "roundtrip.mlir");
        CHECK(reparsed.print() == text);
        CHECK(reparsed.fingerprint() == packed.fingerprint());
        CHECK(reparsed.variant() == builder.describe());
        CHECK(reparsed.variant().packed_sequences);
        // The packed program is the dense one with the keyword: the same steps, a different fingerprint.
        AttentionVariant expected = dense.variant();
        expected.packed_sequences = true;
        CHECK(reparsed.variant() == expected);
        CHECK(packed.fingerprint() != dense.fingerprint());
        CHECK(dense.print().find("packed_sequences") == std::string::npos);
      }
}

TEST_CASE("texts without the keyword parse as dense programs, with it as packed ones") {
  const std::string dense_text = ir_test::kSageBCausalLseProgram;
  CHECK_FALSE(ir::Program::parse(dense_text, "dense.mlir").variant().packed_sequences);
  const std::string packed_text =
      ir_test::applyEdits(dense_text, {{"block_kv(64) {", "block_kv(64) packed_sequences {"}});
  const AttentionVariant packed = ir::Program::parse(packed_text, "packed.mlir").variant();
  CHECK(packed.packed_sequences);
  CHECK(packed.mask.kind == MaskKind::causal);
  // The keyword belongs after block_kv, and the attribute dictionary may not restate it.
  CHECK_FALSE(errorOf(ir_test::applyEdits(dense_text, {{"@t version(1)", "@t packed_sequences version(1)"}})).empty());
  CHECK(errorOf(ir_test::applyEdits(packed_text, {{"packed_sequences {", "packed_sequences attributes "
                                                                         "{packed_sequences} {"}}))
            .find("which its syntax already gives") != std::string::npos);
}

TEST_CASE("legalization keeps packed_sequences") {
  const ir::Program packed = dsl::preset("sage2-int4", 128)->packed_sequences().build();
  const ir::Program legalized = ir::legalizeForTarget(packed, "sm_90a");
  CHECK(legalized.print().find("sage.decode") != std::string::npos);
  CHECK(legalized.variant().packed_sequences);
}

TEST_CASE("the verifier refuses packed sequences with a block_sparse mask or SLA, saying why") {
  const std::string block_sparse =
      ir_test::applyEdits(ir_test::kSageBCausalLseProgram, {{"block_kv(64) {", "block_kv(64) packed_sequences {"},
                                                            {"%s_dequant causal", "%s_dequant block_sparse"}});
  const std::string error = errorOf(block_sparse);
  CHECK(error.find("packed.mlir:1:") != std::string::npos);
  CHECK(error.find("packed_sequences: a block_sparse mask is given per dense batch entry") != std::string::npos);
  CHECK(errorOf(ir_test::applyEdits(block_sparse, {{" packed_sequences {", " {"}})).empty()); // dense: fine

  const std::string sla = dsl::preset("sla-f16", 64)->build().print();
  REQUIRE(errorOf(sla).empty());
  const std::string packed_sla = ir_test::applyEdits(sla, {{"block_kv(64) {", "block_kv(64) packed_sequences {"}});
  CHECK(errorOf(packed_sla).find("packed_sequences: SLA is not built for packed batches yet") != std::string::npos);
}

TEST_CASE("the DSL's packed_sequences() and packedSequencesOf refuse what the verifier refuses") {
  const AttentionVariant dense = dsl::preset("sage-b", 64, MaskKind::causal)->describe();
  const AttentionVariant packed = packedSequencesOf(dense);
  CHECK(packed.packed_sequences);
  CHECK(packed.name == dense.name);
  AttentionVariant back = packed;
  back.packed_sequences = false;
  CHECK(back == dense);
  CHECK(packedSequencesOf(packed) == packed);
  CHECK(dsl::preset("sage-b", 64, MaskKind::causal)->packed_sequences().describe() == packed);

  AttentionVariant block_sparse = dense;
  block_sparse.mask.kind = MaskKind::block_sparse;
  CHECK_THROWS_WITH_AS(packedSequencesOf(block_sparse), doctest::Contains("block_sparse mask is given per dense batch"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dsl::preset("sage-b", 64, MaskKind::block_sparse)->packed_sequences().describe(),
                       doctest::Contains("not built for packed batches yet"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(dsl::preset("sla-int8", 64)->packed_sequences().build(),
                       doctest::Contains("'sla-int8': packed_sequences: SLA is not built"), std::invalid_argument);
  CHECK(packedSequencesProblem(MaskKind::causal, false).empty());
  CHECK(packedSequencesProblem(MaskKind::none, false).empty());
}
