// v_codes in the token order of the Hopper wgmma P.V: the permutation is a bijection on every 32-token group, an
// 8-bit A fragment slot of a thread names an S accumulator column that the same thread holds (the PTX fragment
// tables of FragmentLayout.h), the prologue option changes only the V-quantizing launch, and the natural order is
// the default and unchanged.
#include "PrologueTestVariants.h"
#include "sage/codegen/FragmentLayout.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <doctest/doctest.h>

#include <set>
#include <stdexcept>
#include <string>

using namespace sage;
using schedules::InputType;
using schedules::VCodesTokenOrder;

namespace {

constexpr VCodesTokenOrder kInterleaved = VCodesTokenOrder::wgmma_interleaved_32;

codegen::PrologueOptions interleavedOptions() {
  codegen::PrologueOptions options;
  options.v_codes_token_order = kInterleaved;
  return options;
}

prologue_test::VariantKind kindNamed(const std::string &name) {
  for (const prologue_test::VariantKind &kind : prologue_test::variantKinds())
    if (kind.name == name)
      return kind;
  throw std::logic_error("no variant kind " + name);
}

} // namespace

TEST_CASE("the wgmma token order is a bijection on each group of 32 and leaves groups in place") {
  for (int64_t group : {0, 1, 7, 1000}) {
    std::set<int64_t> tokens;
    for (int64_t p = 0; p < 32; ++p) {
      const int64_t token = schedules::vCodesTokenAt(kInterleaved, 32 * group + p);
      CHECK(token / 32 == group);
      tokens.insert(token);
    }
    CHECK(tokens.size() == 32);
  }
  // The formula of the contract, spelled out on a few positions: h = p / 16, q = (p % 16) / 4, i = p % 4 ->
  // 16h + 8(i / 2) + 2q + i % 2.
  CHECK(schedules::vCodesTokenAt(kInterleaved, 0) == 0);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 1) == 1);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 2) == 8);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 3) == 9);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 4) == 2);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 15) == 15);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 18) == 24);
  CHECK(schedules::vCodesTokenAt(kInterleaved, 32 + 6) == 32 + 10);
  for (int64_t p = 0; p < 100; ++p)
    CHECK(schedules::vCodesTokenAt(VCodesTokenOrder::natural, p) == p);
  CHECK_THROWS_AS(schedules::vCodesTokenAt(kInterleaved, -1), std::invalid_argument);
}

TEST_CASE("each 8-bit A slot of a thread names an S accumulator column that thread holds") {
  // S accumulator tiles of n = 8 (the PTX m16n8 C/D table, which a wgmma accumulator repeats every 8 columns)
  // and the m16n8k32 8-bit A table (the register A fragment of an 8-bit wgmma is laid out the same way).
  const schedules::MmaShape accumulator_shape{16, 8, 16, ElementType::f16, ElementType::f16, AccumulatorType::f32};
  const schedules::MmaShape a_shape{16, 8, 32, ElementType::e4m3, ElementType::e4m3, AccumulatorType::f32};
  const int a_elements = codegen::fragmentElements(a_shape, codegen::MmaOperand::a);
  const int accumulator_elements = codegen::fragmentElements(accumulator_shape, codegen::MmaOperand::accumulator);
  REQUIRE(a_elements == 16);
  REQUIRE(accumulator_elements == 4);
  for (int lane = 0; lane < 32; ++lane)
    for (int element = 0; element < a_elements; ++element) {
      const codegen::MatrixCoordinate slot =
          codegen::fragmentCoordinate(a_shape, codegen::MmaOperand::a, lane, element);
      const int64_t column = schedules::vCodesTokenAt(kInterleaved, slot.column); // P's k = S's column
      bool held = false;
      for (int e = 0; e < accumulator_elements; ++e) {
        const codegen::MatrixCoordinate at =
            codegen::fragmentCoordinate(accumulator_shape, codegen::MmaOperand::accumulator, lane, e);
        for (int tile = 0; tile < 4; ++tile) // the 4 accumulator tiles of 8 columns that make one k = 32 step
          held = held || (at.row == slot.row && tile * 8 + at.column == column);
      }
      CAPTURE(lane);
      CAPTURE(element);
      CHECK(held);
    }
  // The same, from the brief's description of the layouts: the thread with lane % 4 = q holds columns
  // 8j + 2q + {0, 1} and A slots k = 4q + {0..3}, 16 + 4q + {0..3}.
  for (int q = 0; q < 4; ++q) {
    std::set<int64_t> held, needed;
    for (int j = 0; j < 4; ++j)
      for (int b = 0; b < 2; ++b)
        held.insert(8 * j + 2 * q + b);
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < 4; ++i)
        needed.insert(schedules::vCodesTokenAt(kInterleaved, 16 * half + 4 * q + i));
    CHECK(held == needed);
  }
}

TEST_CASE("the prologue option: natural by default, interleaved changes only the V-quantizing kernel") {
  for (const char *name : {"per_token_smooth_k_int8_v", "per_block_smooth_kv_int8_v", "per_tensor_smooth_qk_int8_v",
                           "e4m3_qk_per_block_smooth_kv_e4m3_v"})
    for (InputType input : {InputType::f16, InputType::bf16}) {
      CAPTURE(name);
      const AttentionVariant variant = prologue_test::makeVariant(kindNamed(name), 128);
      const codegen::PrologueSource by_default = codegen::PrologueGenerator::generate(variant, input, 128);
      const codegen::PrologueSource natural = codegen::PrologueGenerator::generate(variant, input, 128, {}, {});
      const codegen::PrologueSource interleaved =
          codegen::PrologueGenerator::generate(variant, input, 128, {}, interleavedOptions());
      CHECK(by_default.options.v_codes_token_order == VCodesTokenOrder::natural);
      CHECK(interleaved.options.v_codes_token_order == kInterleaved);
      REQUIRE(natural.kernels.size() == interleaved.kernels.size());
      int changed = 0;
      for (size_t i = 0; i < natural.kernels.size(); ++i) {
        CHECK(by_default.kernels[i].source == natural.kernels[i].source);
        const bool quantizes_v = natural.kernels[i].source.find("quantizeVTile(params") != std::string::npos;
        CHECK(natural.kernels[i].source.find("vTokenAtPosition") == std::string::npos);
        if (quantizes_v) {
          ++changed;
          const std::string &text = interleaved.kernels[i].source;
          // The V tile's template reads and bounds-checks its tokens through the token order it is given.
          const std::string smoothed = variant.smooth_v == SmoothScope::sequence ? "true" : "false";
          CHECK(text.find("quantizeVTileOf<" + smoothed + ", VQuantizer, WgmmaTokenOrder>(params, cta, shared);") !=
                std::string::npos);
          CHECK(natural.kernels[i].source.find("quantizeVTileOf<" + smoothed +
                                               ", VQuantizer, NaturalTokenOrder>(params, cta, shared);") !=
                std::string::npos);
          CHECK(text.find("16 * (p / 16) + 8 * (p % 4 / 2) + 2 * (p % 16 / 4) + p % 2") != std::string::npos);
        } else {
          // Other kernels differ only in the header comment that describes the variant.
          const auto body = [](const std::string &source) { return source.substr(source.find("#ifndef")); };
          CHECK(body(interleaved.kernels[i].source) == body(natural.kernels[i].source));
        }
      }
      CHECK(changed == 1);
    }
  // Variants without v_codes are not affected; a 16-token KV block cannot hold a 32-token group.
  const AttentionVariant f16_v = prologue_test::makeVariant(kindNamed("per_block_smooth_k_f16_v"), 64);
  const codegen::PrologueSource plain = codegen::PrologueGenerator::generate(f16_v, InputType::f16, 64);
  const codegen::PrologueSource asked =
      codegen::PrologueGenerator::generate(f16_v, InputType::f16, 64, {}, interleavedOptions());
  for (size_t i = 0; i < plain.kernels.size(); ++i)
    CHECK(plain.kernels[i].source == asked.kernels[i].source);
  const AttentionVariant small_blocks = prologue_test::makeVariant(kindNamed("per_token_smooth_k_int8_v"), 64, 128, 16);
  CHECK_THROWS_WITH_AS(
      codegen::PrologueGenerator::generate(small_blocks, InputType::f16, 64, {}, interleavedOptions()),
      doctest::Contains("options.v_codes_token_order: wgmma_interleaved_32 permutes groups of 32 tokens"),
      std::invalid_argument);
  CHECK_NOTHROW(codegen::PrologueGenerator::generate(small_blocks, InputType::f16, 64));
}
