// The packed (variable-length) prologue's plan: the dense plan's launches, roles and grids for the call's maximum
// lengths (the workspace keeps its dense layout), the packed constant in every kernel, no one-pass launch and no
// skipped prologue. Its numerics are checked on a GPU (tests/gpu/GpuPackedPrologueTest.cpp).
#include "PrologueTestVariants.h"
#include "sage/codegen/PrologueConfig.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/codegen/PrologueLaunch.h"
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using schedules::InputType;

namespace {

AttentionVariant packedOf(const AttentionVariant &variant) { return packedSequencesOf(variant); }

std::vector<unsigned> gridsOf(const codegen::PrologueSource &prologue, const schedules::ProblemShape &shape) {
  std::vector<unsigned> grids;
  for (const codegen::LaunchGrid &grid : codegen::prologueGrids(prologue, shape))
    grids.push_back(grid.x);
  return grids;
}

} // namespace

TEST_CASE("a packed prologue has the dense plan's launches, roles and grids for the maximum lengths") {
  std::vector<AttentionVariant> variants;
  for (const prologue_test::VariantKind &kind : prologue_test::variantKinds())
    variants.push_back(prologue_test::makeVariant(kind, 64));
  for (const char *preset : {"sage-b", "sage2-fp8", "sage2-int4", "exact"})
    variants.push_back(dsl::preset(preset, 128)->describe());
  // Three sequences, the longest 1000 queries and 3001 keys: the grids of a dense call of that shape.
  for (const AttentionVariant &dense : variants)
    for (InputType input : {InputType::f16, InputType::bf16}) {
      CAPTURE(dense.name);
      const codegen::PrologueSource dense_prologue = codegen::PrologueGenerator::generate(dense, input, dense.head_dim);
      const codegen::PrologueSource packed_prologue =
          codegen::PrologueGenerator::generate(packedOf(dense), input, dense.head_dim);
      REQUIRE(packed_prologue.kernels.size() == dense_prologue.kernels.size());
      for (size_t i = 0; i < packed_prologue.kernels.size(); ++i) {
        const codegen::PrologueKernel &packed = packed_prologue.kernels[i], &plain = dense_prologue.kernels[i];
        CHECK(packed.entry_point == plain.entry_point);
        CHECK(packed.roles == plain.roles);
        CHECK(packed.block_threads == plain.block_threads);
        CHECK(!packed.one_pass);
        // The device code's switch (sage/device/prologue/sequences.cuh), and the dense kernels keep theirs off.
        CHECK(packed.source.find("constexpr bool kPackedSequences = true;") != std::string::npos);
        CHECK(plain.source.find("constexpr bool kPackedSequences = false;") != std::string::npos);
      }
      const schedules::ProblemShape shape{3, 8, 2, 1000, 3001, dense.head_dim};
      CHECK(gridsOf(packed_prologue, shape) == gridsOf(dense_prologue, shape));
      CHECK(codegen::makePrologueConfig(packedOf(dense), input, dense.head_dim, {}).packed_sequences);
      CHECK(!codegen::makePrologueConfig(dense, input, dense.head_dim, {}).packed_sequences);
    }
}

TEST_CASE("the one-pass prologue refuses packed sequences, naming the tunable") {
  codegen::PrologueTunables one_pass;
  one_pass.one_pass = true;
  for (const char *preset : {"sage-b", "sage2-fp8"}) {
    CAPTURE(preset);
    const AttentionVariant packed = packedOf(dsl::preset(preset, 128)->describe());
    CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(packed, InputType::f16, 128, one_pass),
                         doctest::Contains("tunables.one_pass: the one-pass prologue does not take packed"),
                         std::invalid_argument);
    // The same variant dense takes it; packed with two launches too.
    CHECK(codegen::PrologueGenerator::generate(dsl::preset(preset, 128)->describe(), InputType::f16, 128, one_pass)
              .kernels.front()
              .one_pass);
    CHECK_NOTHROW(codegen::PrologueGenerator::generate(packed, InputType::f16, 128));
  }
}

TEST_CASE("a packed call never skips the prologue: its Q and K are gathered into the dense slots") {
  const AttentionVariant exact = dsl::preset("exact", 128)->describe();
  CHECK(codegen::prologueOnlyCopiesQk(exact, InputType::f16)); // dense: the shortcut holds
  CHECK(!codegen::prologueOnlyCopiesQk(packedOf(exact), InputType::f16));
  CHECK(!codegen::prologueOnlyCopiesQk(packedOf(exact), InputType::bf16));
}
