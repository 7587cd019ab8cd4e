// The prologue generator's plan: which launches and roles each variant gets, each launch's grid (hand-computed),
// the parameters block, what the generated text says, and the errors for what the prologue cannot do.
#include "PrologueTestVariants.h"
#include "sage/codegen/PrologueConfig.h"
#include "sage/codegen/PrologueGenerator.h"
#include "sage/codegen/PrologueLaunch.h"
#include "sage/dsl/Presets.h"
#include "sage/schedules/WorkspaceLayout.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using codegen::PrologueRole;
using codegen::PrologueSource;
using prologue_test::VariantKind;
using prologue_test::VKind;
using schedules::InputType;

namespace {

VariantKind kindNamed(const std::string &name) {
  for (const VariantKind &kind : prologue_test::variantKinds())
    if (kind.name == name)
      return kind;
  throw std::logic_error("no variant kind " + name);
}

PrologueSource generate(const std::string &kind, InputType input = InputType::f16, int head_dim = 64) {
  return codegen::PrologueGenerator::generate(prologue_test::makeVariant(kindNamed(kind), head_dim), input, head_dim);
}

codegen::PrologueTunables twoLaunches() {
  codegen::PrologueTunables tunables;
  tunables.one_pass = false;
  return tunables;
}

codegen::PrologueTunables onePassTunables() {
  codegen::PrologueTunables tunables;
  tunables.one_pass = true;
  return tunables;
}

PrologueSource generateOnePass(const std::string &kind, InputType input = InputType::f16, int head_dim = 64) {
  return codegen::PrologueGenerator::generate(prologue_test::makeVariant(kindNamed(kind), head_dim), input, head_dim,
                                              onePassTunables());
}

PrologueSource generateTwoLaunches(const std::string &kind, InputType input = InputType::f16, int head_dim = 64) {
  return codegen::PrologueGenerator::generate(prologue_test::makeVariant(kindNamed(kind), head_dim), input, head_dim,
                                              twoLaunches());
}

std::vector<std::vector<PrologueRole>> rolesOf(const PrologueSource &prologue) {
  std::vector<std::vector<PrologueRole>> roles;
  for (const codegen::PrologueKernel &kernel : prologue.kernels)
    roles.push_back(kernel.roles);
  return roles;
}

schedules::ProblemShape shapeOf(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q, int64_t tokens_kv,
                                int64_t head_dim) {
  return {batch, heads_q, heads_kv, tokens_q, tokens_kv, head_dim};
}

std::vector<unsigned> gridsOf(const PrologueSource &prologue, const schedules::ProblemShape &shape) {
  std::vector<unsigned> grids;
  for (const codegen::LaunchGrid &grid : codegen::prologueGrids(prologue, shape)) {
    CHECK(grid.y == 1);
    CHECK(grid.z == 1);
    grids.push_back(grid.x);
  }
  return grids;
}

using Role = PrologueRole;

} // namespace

TEST_CASE("launch plans: statistics and the first read, then the second read that combines them") {
  // SageAttn-B, f16 input: mean(K) needs the whole sequence; V is read in place.
  CHECK(rolesOf(generateTwoLaunches("per_block_smooth_k_f16_v")) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::q_block_quantize}, {Role::k_block_quantize}});
  // bf16 input: V is converted to f16 in the first read.
  CHECK(rolesOf(generateTwoLaunches("per_block_smooth_k_f16_v", InputType::bf16)) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::q_block_quantize, Role::v_tile_convert},
                                       {Role::k_block_quantize}});
  // Nothing to reduce over the sequence: one launch.
  CHECK(rolesOf(generateTwoLaunches("per_block_unsmoothed_f16_v")) ==
        std::vector<std::vector<Role>>{{Role::q_block_quantize, Role::k_block_quantize}});
  // Per-channel V: its amax is reduced with mean(K); K and V are quantized in the second launch.
  CHECK(rolesOf(generateTwoLaunches("per_token_smooth_k_int8_v")) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::v_column_statistics, Role::q_block_quantize},
                                       {Role::k_block_quantize, Role::v_tile_quantize}});
  // Smoothed f16 V is converted once mean(V) is known.
  CHECK(rolesOf(generateTwoLaunches("per_block_smooth_qkv_f16_v")) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::v_column_statistics, Role::q_block_quantize},
                                       {Role::k_block_quantize, Role::v_tile_convert}});
  // Per-tensor scales: amax first, codes and scales on the second read.
  CHECK(rolesOf(generateTwoLaunches("per_tensor_smooth_qk_int8_v")) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::v_column_statistics, Role::q_block_statistics},
                                       {Role::k_block_quantize, Role::v_tile_quantize, Role::q_block_quantize}});
  // A K that needs no statistics is quantized in the first read even when V has some.
  VariantKind unsmoothed_k = kindNamed("per_token_smooth_k_int8_v");
  unsmoothed_k.smooth_k = false;
  CHECK(rolesOf(codegen::PrologueGenerator::generate(prologue_test::makeVariant(unsmoothed_k, 64), InputType::f16, 64,
                                                     twoLaunches())) ==
        std::vector<std::vector<Role>>{{Role::v_column_statistics, Role::q_block_quantize, Role::k_block_quantize},
                                       {Role::v_tile_quantize}});
}

TEST_CASE(
    "one-pass plans (opt-in): the statistics, the tiles that wait for them, then the roles that wait for nothing") {
  const auto onePass = [](const PrologueSource &prologue) {
    return prologue.kernels.size() == 1 && prologue.kernels[0].one_pass &&
           prologue.kernels[0].entry_point == "sage_prologue_one_pass";
  };
  // SageAttn-B: mean(K), then K's tiles; Q's blocks last.
  const PrologueSource sage_b = generateOnePass("per_block_smooth_k_f16_v");
  CHECK(onePass(sage_b));
  CHECK(rolesOf(sage_b) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::k_block_quantize, Role::q_block_quantize}});
  // bf16: V's f16 copy needs no statistics.
  CHECK(rolesOf(generateOnePass("per_block_smooth_k_f16_v", InputType::bf16)) ==
        std::vector<std::vector<Role>>{
            {Role::k_column_statistics, Role::k_block_quantize, Role::q_block_quantize, Role::v_tile_convert}});
  CHECK(rolesOf(generateOnePass("per_token_smooth_k_int8_v")) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::v_column_statistics, Role::k_block_quantize,
                                        Role::v_tile_quantize, Role::q_block_quantize}});
  CHECK(rolesOf(generateOnePass("per_block_smooth_qkv_f16_v")).size() ==
        2); // Q smoothing: K's tiles need launch 1's q_mean
  // Only V has statistics: K's tiles wait for nothing.
  VariantKind unsmoothed_k = kindNamed("per_token_smooth_k_int8_v");
  unsmoothed_k.smooth_k = false;
  CHECK(rolesOf(codegen::PrologueGenerator::generate(prologue_test::makeVariant(unsmoothed_k, 64), InputType::f16, 64,
                                                     onePassTunables())) ==
        std::vector<std::vector<Role>>{
            {Role::v_column_statistics, Role::v_tile_quantize, Role::q_block_quantize, Role::k_block_quantize}});
  // A per-tensor psi_Q needs its amax before its codes: two launches.
  CHECK(rolesOf(generateOnePass("per_tensor_smooth_qk_int8_v")).size() == 2);
  // Nothing to reduce: one ordinary launch, no counters.
  const PrologueSource plain = generateOnePass("per_block_unsmoothed_f16_v");
  CHECK(!plain.kernels[0].one_pass);
  const AttentionVariant sage2 = dsl::preset("sage2-fp8", 128)->describe();
  const schedules::ProblemShape shape = shapeOf(2, 8, 4, 1000, 3000, 128);
  const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(sage2, shape, InputType::f16);
  // The ticket, then one count per KV head, zeroed before the launch; none for a plan without one pass.
  CHECK(layout.prologue_counters.bytes >= (1 + 2 * 4) * 4);
  CHECK(
      codegen::prologueCounterBytes(codegen::PrologueGenerator::generate(sage2, InputType::f16, 128, onePassTunables()),
                                    layout) == layout.prologue_counters.bytes);
  CHECK(codegen::prologueCounterBytes(codegen::PrologueGenerator::generate(sage2, InputType::f16, 128, twoLaunches()),
                                      layout) == 0);
  // The same total of CTAs as the two launches together: one ticket each.
  const std::vector<unsigned> one =
      gridsOf(codegen::PrologueGenerator::generate(sage2, InputType::f16, 128, onePassTunables()), shape);
  const std::vector<unsigned> two =
      gridsOf(codegen::PrologueGenerator::generate(sage2, InputType::f16, 128, twoLaunches()), shape);
  REQUIRE(one.size() == 1);
  REQUIRE(two.size() == 2);
  CHECK(one[0] == two[0] + two[1]);
  codegen::PrologueTunables bad = onePassTunables();
  bad.one_pass_lookahead_heads = 9;
  CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(sage2, InputType::f16, 128, bad),
                       doctest::Contains("tunables.one_pass_lookahead_heads: expected 0 to 8, got 9"),
                       std::invalid_argument);
}

TEST_CASE("Q smoothing: the K tiles write delta_s after launch 1's q_mean; int4 codes one per byte") {
  // sage2-int4: K and V statistics in launch 1 with psi_Q (and q_mean); K (with delta_s) and V in launch 2.
  const AttentionVariant int4 = dsl::preset("sage2-int4", 128)->describe();
  const PrologueSource prologue = codegen::PrologueGenerator::generate(int4, InputType::f16, 128);
  CHECK(rolesOf(prologue) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::v_column_statistics, Role::q_block_quantize},
                                       {Role::k_block_quantize, Role::v_tile_quantize}});
  REQUIRE(prologue.kernels.size() == 2);
  const std::string &first = prologue.kernels[0].source, &second = prologue.kernels[1].source;
  CHECK(first.find("params.offsets.q_mean") != std::string::npos);
  CHECK(first.find("writeQMeanCorrection") == std::string::npos);
  CHECK(second.find("writeQMeanCorrection(k, params, head, first, stored_rows);") != std::string::npos);
  CHECK(second.find("params.offsets.delta_s") != std::string::npos);
  CHECK(second.find("sum = __fmaf_rn(mean[j], k(pass, j), sum);") != std::string::npos);
  // The K tile and the GEMV are the device library's headers, pasted (the prologue is one translation unit).
  CHECK(second.find("// ---- begin sage/device/prologue/q_mean_correction.cuh ----") != std::string::npos);
  CHECK(second.find("using sage::device::prologue::writeQMeanCorrection;") != std::string::npos);
  CHECK(second.find("using KTile = sage::device::prologue::KTileOf<true>;") != std::string::npos); // K smoothed
  CHECK(second.find("#include") == std::string::npos);
  for (const std::string *source : {&first, &second}) {
    CHECK(source->find("static constexpr float kCodeMax = 7.0f;") != std::string::npos);
    CHECK(source->find("return packInt4Codes(scaled);") != std::string::npos);
    CHECK(source->find("code < -7 ? -7 : code > 7 ? 7 : code") != std::string::npos);
  }
  // Without Q smoothing there is no delta_s.
  const AttentionVariant unsmoothed = dsl::preset("sage2-int4-no-smooth-q", 128)->describe();
  for (const codegen::PrologueKernel &kernel :
       codegen::PrologueGenerator::generate(unsmoothed, InputType::f16, 128).kernels)
    CHECK(kernel.source.find("kQMeanCorrection = true") == std::string::npos);
  // Q smoothed but K not: K still waits for launch 1's q_mean, in a second launch of its own.
  VariantKind smooth_q_only = kindNamed("per_block_unsmoothed_f16_v");
  smooth_q_only.smooth_q = true;
  const PrologueSource smooth_q_prologue =
      codegen::PrologueGenerator::generate(prologue_test::makeVariant(smooth_q_only, 64), InputType::f16, 64);
  CHECK(rolesOf(smooth_q_prologue) ==
        std::vector<std::vector<Role>>{{Role::q_block_quantize}, {Role::k_block_quantize}});
  CHECK(smooth_q_prologue.kernels[1].source.find("writeQMeanCorrection") != std::string::npos);
}

TEST_CASE("FP4: microscaled Q and K along the channels, V^T along the tokens, with the device library's arithmetic") {
  for (const char *name : {"sage3-fp4", "sage3-mxfp4"}) {
    CAPTURE(name);
    const AttentionVariant variant = dsl::preset(name, 128)->describe();
    const bool mx = std::string(name) == "sage3-mxfp4";
    const codegen::PrologueConfig config = codegen::makePrologueConfig(variant, InputType::f16, 128, {});
    CHECK(config.q.microscaled());
    CHECK(config.q.groupChannels() == (mx ? 32 : 16));
    CHECK(config.v_output == codegen::VOutput::fp4_codes);
    CHECK(config.vGroupTokens() == (mx ? 32 : 16));
    // V's microscales need no statistics: V is quantized in the first read, K (smoothed, with delta_s) in the second.
    const PrologueSource prologue = codegen::PrologueGenerator::generate(variant, InputType::f16, 128);
    CHECK(rolesOf(prologue) ==
          std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::q_block_quantize, Role::v_tile_quantize},
                                         {Role::k_block_quantize}});
    const std::string &first = prologue.kernels[0].source, &second = prologue.kernels[1].source;
    for (const std::string *source : {&first, &second}) {
      CHECK(source->find("namespace sage::device::fp4") != std::string::npos); // the device library, pasted in
      CHECK(source->find("#pragma once") == std::string::npos);
    }
    CHECK(first.find("quantizeFp4QBlockOf<QBlock, QQuantizer>(params, cta, shared);") != std::string::npos);
    // V^T's codes and scales: v_fp4_quantize.cuh, instantiated for the group (32: MXFP4, 16: NVFP4).
    CHECK(first.find("quantizeFp4VTileOf<" + std::string(mx ? "32" : "16") + ">(params, cta, shared);") !=
          std::string::npos);
    CHECK(first.find("// ---- begin sage/device/prologue/v_fp4_quantize.cuh ----") != std::string::npos);
    CHECK(first.find("codes + row * (params.size.padded_kv / 2) + (v_tile.first + token) / 2") != std::string::npos);
    CHECK(second.find("kMicroscaled = true") != std::string::npos); // k_quantize.cuh: storeMicroscaledTile
    for (const std::string *source : {&first, &second}) {
      CHECK(source->find("// ---- begin sage/device/prologue/microscaled_tile.cuh ----") != std::string::npos);
      CHECK(source->find("using sage::device::prologue::storeMicroscaledTile;") != std::string::npos);
    }
    CHECK(second.find("writeQMeanCorrection") != std::string::npos);
  }
  // What FP4 the prologue refuses, naming the field.
  AttentionVariant bad = dsl::preset("sage3-fp4", 128)->describe();
  bad.q.scale_type = ScaleType::ue8m0;
  CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(bad, InputType::f16, 128),
                       doctest::Contains("q: microscale_1x16 takes ue4m3 scales"), std::invalid_argument);
  bad = dsl::preset("sage3-fp4", 128)->describe();
  bad.v.dtype = ElementType::int8;
  CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(bad, InputType::f16, 128),
                       doctest::Contains("v.dtype: microscaled V codes are e2m1"), std::invalid_argument);
}

TEST_CASE(
    "every preset and variant kind takes one launch, or two when it reduces over the sequence and cannot in one") {
  std::vector<AttentionVariant> variants;
  for (const VariantKind &kind : prologue_test::variantKinds())
    variants.push_back(prologue_test::makeVariant(kind, 128));
  for (const dsl::PresetInfo &info : dsl::presets())
    variants.push_back(dsl::preset(info.name, 128)->describe());
  for (const AttentionVariant &variant : variants)
    for (InputType input : {InputType::f16, InputType::bf16}) {
      const codegen::PrologueConfig config = codegen::makePrologueConfig(variant, input, 128, {});
      CAPTURE(variant.name);
      CHECK(codegen::PrologueGenerator::generate(variant, input, 128, twoLaunches()).kernels.size() ==
            (config.usesStatisticsScratch() ? 2u : 1u));
      CHECK(codegen::PrologueGenerator::generate(variant, input, 128, onePassTunables()).kernels.size() ==
            (config.usesStatisticsScratch() &&
                     !codegen::makePrologueConfig(variant, input, 128, onePassTunables()).onePass()
                 ? 2u
                 : 1u));
    }
}

TEST_CASE("makePrologueConfig: an unquantized Q/K is a cast to the input type; an f32 V takes the f16 P.V") {
  const AttentionVariant exact = dsl::preset("exact", 128)->describe();
  for (InputType input : {InputType::f16, InputType::bf16}) {
    const codegen::PrologueConfig config = codegen::makePrologueConfig(exact, input, 128, {});
    const ElementType stored = input == InputType::bf16 ? ElementType::bf16 : ElementType::f16;
    for (const codegen::TokenQuantizerConfig *quantizer : {&config.q, &config.k}) {
      CHECK(quantizer->cast());
      CHECK_FALSE(quantizer->perTensor());
      CHECK(quantizer->dtype == stored);
      CHECK(quantizer->groups_per_tile == 0);
    }
    CHECK_FALSE(config.fold_q_scale);
    CHECK_FALSE(config.kStatistics());
    CHECK_FALSE(config.vStatistics());
    CHECK_FALSE(config.usesE4m3());
    CHECK(config.v_output == (input == InputType::bf16 ? codegen::VOutput::f16_values : codegen::VOutput::none));
  }
  // The quantized presets are unchanged: sage-b's Q and K are int8 codes, one scale per block.
  const codegen::PrologueConfig sage_b =
      codegen::makePrologueConfig(dsl::preset("sage-b", 64)->describe(), InputType::bf16, 64, {});
  CHECK_FALSE(sage_b.q.cast());
  CHECK(sage_b.q.dtype == ElementType::int8);
  CHECK(sage_b.q.groups_per_tile == 1);
  CHECK(sage_b.fold_q_scale);
}

TEST_CASE("unquantized Q and K (the exact preset): cast into q_codes / k_codes in the launches that quantize") {
  const auto exact = [](InputType input, int head_dim = 64) {
    return codegen::PrologueGenerator::generate(dsl::preset("exact", head_dim)->describe(), input, head_dim);
  };
  // Nothing to reduce over the sequence: one launch casts Q and K (and converts a bf16 V to f16).
  CHECK(rolesOf(exact(InputType::f16)) ==
        std::vector<std::vector<Role>>{{Role::q_block_quantize, Role::k_block_quantize}});
  CHECK(rolesOf(exact(InputType::bf16)) ==
        std::vector<std::vector<Role>>{{Role::q_block_quantize, Role::v_tile_convert, Role::k_block_quantize}});
  const std::string f16 = exact(InputType::f16).kernels[0].source;
  CHECK(f16.find("castQBlockOf<QBlock, QQuantizer>(params, cta, shared);") != std::string::npos);
  CHECK(f16.find("kCast = true") != std::string::npos); // k_quantize.cuh: storeTileValues, no scales
  CHECK(f16.find("roundToInput(float value) { return floatToHalfBits(value); }") != std::string::npos);
  CHECK(f16.find("using QBlock = sage::device::prologue::QBlockOf<false, false>;") !=
        std::string::npos); // exact leaves the softmax scale to the kernel, and Q is not smoothed
  CHECK(f16.find("params.offsets.q_scales") == std::string::npos);
  const std::string bf16 = exact(InputType::bf16, 128).kernels[0].source;
  CHECK(bf16.find("cvt.rn.bf16.f32") != std::string::npos); // round to nearest even, not the truncating floatToInput
  CHECK(bf16.find("psi_Q: none (the operand is not quantized): values rounded to bf16") != std::string::npos);

  // A cast Q that folds the softmax scale multiplies in f32 before rounding; a smoothed cast K is K - mean(K).
  const PrologueSource folded = generate("unquantized_folded_smooth_k_f16_v");
  CHECK(rolesOf(folded) ==
        std::vector<std::vector<Role>>{{Role::k_column_statistics, Role::q_block_quantize}, {Role::k_block_quantize}});
  CHECK(folded.kernels[0].source.find("__fmul_rn(tile.element(pass, j), prescale)") != std::string::npos);
  CHECK(folded.kernels[1].source.find("__fsub_rn(tile.element(pass, j), mean[j])") != std::string::npos);
  CHECK(folded.kernels[1].source.find("kStatistics = true, kSmoothed = true") != std::string::npos);
  CHECK(folded.kernels[1].source.find("kCast = true") != std::string::npos);

  // The grid is that of the quantized variants: 24 Q blocks and 4 KV heads x ceil(6 / 4) K tiles; a bf16 V adds
  // 4 KV heads x ceil(384 / 256) V tiles.
  const schedules::ProblemShape small = shapeOf(2, 4, 2, 300, 333, 64);
  CHECK(gridsOf(exact(InputType::f16), small) == std::vector<unsigned>{24 + 8});
  CHECK(gridsOf(exact(InputType::bf16), small) == std::vector<unsigned>{24 + 8 + 8});
}

TEST_CASE("prologueOnlyCopiesQk and inWorkspaceLayout: when a whole call may read Q and K in place") {
  const AttentionVariant exact = dsl::preset("exact", 128)->describe();
  CHECK(codegen::prologueOnlyCopiesQk(exact, InputType::f16));
  CHECK_FALSE(codegen::prologueOnlyCopiesQk(exact, InputType::bf16)); // it also converts V to f16
  CHECK_FALSE(codegen::prologueOnlyCopiesQk(dsl::preset("sage-b", 128)->describe(), InputType::f16));
  CHECK_FALSE(
      codegen::prologueOnlyCopiesQk(prologue_test::makeVariant(kindNamed("unquantized_folded_smooth_k_f16_v"), 64),
                                    InputType::f16)); // Q scaled, K smoothed

  alignas(16) static unsigned short data[16];
  const codegen::PrologueTensor compact{data, {4 * 256 * 64, 256 * 64, 64}};
  CHECK(compact.inWorkspaceLayout(2, 4, 256, 256, 64));
  CHECK_FALSE(compact.inWorkspaceLayout(2, 4, 250, 256, 64)); // padding rows missing
  CHECK_FALSE(codegen::PrologueTensor{data + 8, {4 * 256 * 64, 256 * 64, 128}}.inWorkspaceLayout(2, 4, 256, 256, 64));
  CHECK_FALSE(codegen::PrologueTensor{data, {256 * 64, 64, 4 * 64}}.inWorkspaceLayout(2, 4, 256, 256, 64)); // NHD
  CHECK_FALSE(codegen::PrologueTensor{data + 1, compact.strides}.inWorkspaceLayout(2, 4, 256, 256, 64));
  CHECK(codegen::PrologueTensor{data, {0, 0, 64}}.inWorkspaceLayout(1, 1, 256, 256, 64)); // size-1 dims: any stride
  CHECK_FALSE(codegen::PrologueTensor{nullptr, compact.strides}.inWorkspaceLayout(2, 4, 256, 256, 64));
}

TEST_CASE("grids: the sum of the roles' CTA counts (hand-computed)") {
  // b = 2, h_q = 4, h_kv = 2, 300 Q and 333 KV tokens, d = 64: 8 Q heads x 3 Q blocks, 4 KV heads x 6 KV blocks.
  const schedules::ProblemShape small = shapeOf(2, 4, 2, 300, 333, 64);
  const PrologueSource sage_b = generate("per_block_smooth_k_f16_v");
  // slices = min(ceil(256 / 4), ceil(333 / 512), 32) = 1: 4 statistics CTAs + 24 Q blocks; K tiles of 4 blocks
  // (32 KiB at d = 64): ceil(6 / 4) = 2 per head -> 8.
  CHECK(gridsOf(sage_b, small) == std::vector<unsigned>{28, 8});
  // 16k tokens, hidden 2048, d = 128: 16 heads, slices = min(ceil(256 / 16), ceil(16384 / 512), 32) = 16.
  const PrologueSource sage_b_128 = generate("per_block_smooth_k_f16_v", InputType::f16, 128);
  const schedules::ProblemShape big = shapeOf(1, 16, 16, 16384, 16384, 128);
  // 16 * 16 statistics + 16 * 128 Q blocks; K tiles of 2 blocks: 16 * 128.
  CHECK(gridsOf(sage_b_128, big) == std::vector<unsigned>{2304, 2048});
  // K and V statistics share the target: 128 CTAs each, slices = 8. K tiles 16 * 128, V tiles of 128 tokens
  // 16 * 128.
  const PrologueSource int8_v = generate("per_token_smooth_k_int8_v", InputType::f16, 128);
  CHECK(gridsOf(int8_v, big) == std::vector<unsigned>{128 + 128 + 2048, 2048 + 2048});
  // Per-tensor: the second read covers the K tiles, the V tiles (256 tokens at d = 64: ceil(384 / 256) = 2 per
  // head) and the 24 Q blocks again.
  const PrologueSource per_tensor = generate("per_tensor_smooth_qk_int8_v");
  CHECK(gridsOf(per_tensor, small) == std::vector<unsigned>{4 + 4 + 24, 8 + 8 + 24});
  CHECK_THROWS_AS(codegen::prologueGrid(sage_b, 3, small), std::invalid_argument);
  CHECK_THROWS_AS(codegen::prologueGrids(sage_b, shapeOf(2, 4, 3, 300, 333, 64)), std::invalid_argument);
  CHECK_THROWS_AS(codegen::prologueGrids(sage_b, shapeOf(2, 4, 2, 300, 333, 128)), std::invalid_argument);
}

TEST_CASE("launch 1's statistics always fit in the workspace's prologue_statistics") {
  // Per channel and slice: 4 bytes of sum per smoothed tensor, 2 + 2 bytes of min and max per per-tensor K or
  // per-channel V; a per-tensor Q adds one f32 per Q block. Checked at the default tunables and at the most
  // slices the tunables allow.
  codegen::PrologueTunables most_slices;
  most_slices.statistics_target_ctas = 1 << 20;
  most_slices.statistics_min_slice_tokens = 16;
  most_slices.max_statistics_slices = 64;
  for (const codegen::PrologueTunables &tunables : {codegen::PrologueTunables{}, most_slices})
    for (VariantKind kind : prologue_test::variantKinds())
      for (int block_kv : {16, 64, 128})
        for (int64_t tokens_kv : {1, 15, 16, 17, 100, 511, 513, 4097, 70000}) {
          kind.k_group_tokens = 0; // the tile, whatever its size
          const AttentionVariant variant = prologue_test::makeVariant(kind, 64, 128, block_kv);
          const codegen::PrologueConfig config = codegen::makePrologueConfig(variant, InputType::bf16, 64, tunables);
          const PrologueSource prologue = codegen::PrologueGenerator::generate(variant, InputType::bf16, 64, tunables);
          const schedules::ProblemShape shape = shapeOf(2, 4, 2, 300, tokens_kv, 64);
          const int64_t slices =
              codegen::prologueRoleCtas(PrologueRole::k_column_statistics, prologue.geometry, shape) / 4;
          const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, shape, InputType::bf16);
          const int64_t column_bytes = (config.smooth_k ? 4 : 0) + (config.smooth_v ? 4 : 0) +
                                       (config.kMinMax() ? 4 : 0) + (config.vMinMax() ? 4 : 0);
          const int64_t q_amax_bytes = config.q.perTensor() ? 8 * 3 * 4 : 0; // 8 Q heads x 3 blocks
          CAPTURE(kind.name);
          CAPTURE(block_kv);
          CAPTURE(tokens_kv);
          CAPTURE(tunables.max_statistics_slices);
          CHECK(slices >= 1);
          // The slices, then the one-pass launch's combined statistics: 4 bytes per channel of each KV head for
          // each of mean(K), the per-tensor K's amax, mean(V) and V's inverse scales that the variant has.
          const int64_t combined_bytes = 4 * 64 * 4 *
                                         ((config.smooth_k ? 1 : 0) + (config.kMinMax() ? 1 : 0) +
                                          (config.smooth_v ? 1 : 0) + (config.vMinMax() ? 1 : 0));
          CHECK(q_amax_bytes + 4 * slices * 64 * column_bytes + combined_bytes <=
                static_cast<int64_t>(layout.prologue_statistics.bytes));
          CHECK(config.usesStatisticsScratch() == (layout.prologue_statistics.bytes > 0));
        }
}

TEST_CASE("the generated text names the algorithm's steps and uses exact f32 operations") {
  const PrologueSource prologue = generate("per_block_smooth_kv_int8_v", InputType::bf16, 128);
  REQUIRE(prologue.kernels.size() == 2);
  std::string all;
  for (const codegen::PrologueKernel &kernel : prologue.kernels) {
    CHECK(kernel.block_threads == 256);
    CHECK(kernel.dynamic_shared_bytes == 0);
    CHECK(kernel.source.rfind("// sagegen quantization prologue, launch ", 0) == 0);
    CHECK(kernel.source.find("struct SagePrologueParams") != std::string::npos); // KernelAbi.h pasted in
    CHECK(kernel.source.find("extern \"C\" __global__") != std::string::npos);
    CHECK(kernel.source.find("#include") == std::string::npos); // self-contained for NVRTC
    CHECK(kernel.grid_rule.rfind("gridDim.x = ", 0) == 0);
    all += kernel.source;
  }
  CHECK(prologue.kernels[0].entry_point == "sage_prologue_read_inputs");
  CHECK(prologue.kernels[1].entry_point == "sage_prologue_quantize_after_statistics");
  // The second launch combines launch 1's slices in every K and V tile; only the first tile stores the results.
  // K smoothed (no per-tensor amax), V smoothed and quantized: the headers' templates, instantiated for the variant.
  CHECK(prologue.kernels[1].source.find("kStatistics = true, kSmoothed = true") != std::string::npos);
  CHECK(prologue.kernels[1].source.find("kPerTensor = false") != std::string::npos);
  CHECK(prologue.kernels[1].source.find("quantizeVTileOf<true, VQuantizer, NaturalTokenOrder>(params, cta, shared);") !=
        std::string::npos);
  CHECK(prologue.kernels[1].source.find("// ---- begin sage/device/prologue/v_statistics.cuh ----") !=
        std::string::npos);
  CHECK(prologue.kernels[0].source.find("params.statistics_offset") != std::string::npos);
  CHECK(all.find("gamma(K) = K - mean(K)") != std::string::npos);
  CHECK(all.find("psi_Q") != std::string::npos);
  CHECK(all.find("per-channel psi_V") != std::string::npos);
  CHECK(all.find("__fdiv_rn(amax, code_max), __fdiv_rn(code_max, amax)") != std::string::npos);
  CHECK(all.find("cvt.rni.sat.s32.f32") != std::string::npos);
  CHECK(all.find("fmaf(") == std::string::npos);
  CHECK(all.find("fma.") == std::string::npos);
  CHECK(all.find("__fdividef") == std::string::npos);
  // e4m3 codes carry their software fallback for GPUs without the conversion.
  const PrologueSource e4m3 = generate("per_warp_smooth_k_e4m3_v");
  CHECK(e4m3.kernels[1].source.find("cvt.rn.satfinite.e4m3x2.f32") != std::string::npos);
  CHECK(e4m3.kernels[1].source.find("encodeE4m3Software") != std::string::npos);
}

TEST_CASE("prologueQPrescale: the folded softmax scale, rounded once to f32") {
  AttentionVariant variant = prologue_test::makeVariant(kindNamed("per_block_smooth_k_f16_v"), 128);
  CHECK(codegen::prologueQPrescale(variant) == static_cast<float>(1.0 / std::sqrt(128.0) * 1.4426950408889634074));
  variant.exp2_softmax = false;
  CHECK(codegen::prologueQPrescale(variant) == static_cast<float>(1.0 / std::sqrt(128.0)));
  variant.q.fold_softmax_scale = false;
  CHECK(codegen::prologueQPrescale(variant) == 1.0f);
}

TEST_CASE("makePrologueParams: sizes and offsets from the layout; misaligned tensors are rejected") {
  const AttentionVariant variant = prologue_test::makeVariant(kindNamed("per_block_smooth_qkv_f16_v"), 64);
  const schedules::ProblemShape shape = shapeOf(2, 4, 2, 300, 333, 64);
  const schedules::WorkspaceLayout layout = schedules::computeWorkspaceLayout(variant, shape, InputType::f16);
  alignas(256) static unsigned char workspace[256];
  alignas(16) static unsigned short data[16];
  const codegen::PrologueTensor tensor{data, {4 * 300 * 64, 300 * 64, 64}};
  const SagePrologueParams params =
      codegen::makePrologueParams(variant, shape, layout, tensor, tensor, tensor, workspace);
  CHECK(params.size.heads_q == 4);
  CHECK(params.size.padded_q == 384);
  CHECK(params.size.padded_kv == 384);
  CHECK(params.size.q_scale_count == 3);
  CHECK(params.size.k_scale_count == 6);
  CHECK(params.offsets.k_codes == layout.k_codes.offset);
  CHECK(params.offsets.q_mean == layout.q_mean.offset);
  CHECK(params.offsets.v_values == layout.v_values.offset);
  CHECK(params.q_prescale == codegen::prologueQPrescale(variant));
  CHECK(params.q_strides.token == 64);
  CHECK(params.statistics_offset == layout.prologue_statistics.offset);
  CHECK(layout.prologue_statistics.bytes > 0);

  const codegen::PrologueTensor misaligned{data + 1, tensor.strides};
  CHECK_THROWS_WITH_AS(codegen::makePrologueParams(variant, shape, layout, misaligned, tensor, tensor, workspace),
                       doctest::Contains("q: data must be 16-byte aligned"), std::invalid_argument);
  const codegen::PrologueTensor odd_stride{data, {4 * 300 * 64, 300 * 64, 68}};
  CHECK_THROWS_WITH_AS(codegen::makePrologueParams(variant, shape, layout, tensor, odd_stride, tensor, workspace),
                       doctest::Contains("k: strides must be multiples of 8"), std::invalid_argument);
}

TEST_CASE("the generator names what it cannot do") {
  const AttentionVariant base = prologue_test::makeVariant(kindNamed("per_block_smooth_k_f16_v"), 64);
  const auto rejects = [](const AttentionVariant &variant, const char *needle, int head_dim = 64,
                          const codegen::PrologueTunables &tunables = {}) {
    CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(variant, InputType::f16, head_dim, tunables),
                         doctest::Contains(needle), std::invalid_argument);
  };
  rejects(base, "head_dim: 128 does not match", 128);
  AttentionVariant variant = base;
  variant.head_dim = 264;
  rejects(variant, "head_dim: head_dim 264: the quantization prologue handles head_dim 16..256", 264);
  variant = base;
  variant.q.dtype = ElementType::e2m1;
  rejects(variant, "q.dtype");
  variant = base;
  variant.k.granularity = Granularity::microscale_1x16; // microscaling is FP4's
  rejects(variant, "k.dtype: microscaled codes are e2m1");
  variant = base;
  variant.k.granularity = Granularity::per_channel;
  rejects(variant, "k.granularity");
  variant = base;
  variant.q.group_tokens = 48;
  rejects(variant, "q.group_tokens 48 must divide");
  variant = base;
  variant.smooth_k = SmoothScope::block;
  rejects(variant, "smooth_k");
  variant = base;
  variant.v.dtype = ElementType::bf16; // P.V runs in f16: an unquantized V is f16 or f32
  rejects(variant, "v.dtype");
  variant = base;
  variant.q = prologue_test::tokenQuantizer(ElementType::int8, Granularity::none, 0);
  rejects(variant, "q.dtype: an unquantized (granularity none) operand is a cast");
  variant = base;
  variant.k = prologue_test::tokenQuantizer(ElementType::f32, Granularity::none, 0);
  variant.k.static_scale = 0.5;
  rejects(variant, "k: an unquantized (granularity none) operand has no static");
  variant = base;
  variant.v = prologue_test::tokenQuantizer(ElementType::int8, Granularity::per_token, 0);
  rejects(variant, "v.granularity");
  codegen::PrologueTunables tunables;
  tunables.threads = 100;
  rejects(base, "tunables.threads", 64, tunables);
  tunables = {};
  tunables.max_statistics_slices = 65;
  rejects(base, "tunables.max_statistics_slices: expected 1 to 64", 64, tunables);
  tunables = {};
  tunables.v_tile_tokens = 64;
  rejects(base, "tunables.v_tile_tokens", 64, tunables);
}

TEST_CASE("rotation (issue 28): the psi_Q and psi_K roles rotate, with the seed's signs; Q smoothing's GEMV does not") {
  AttentionVariant variant = prologue_test::makeVariant(kindNamed("per_block_smooth_qkv_f16_v"), 128);
  const PrologueSource plain = codegen::PrologueGenerator::generate(variant, InputType::f16, 128);
  variant.q.rotation_seed = 0;
  variant.k.rotation_seed = 0;
  const PrologueSource rotated = codegen::PrologueGenerator::generate(variant, InputType::f16, 128);
  REQUIRE(rotated.kernels.size() == 2);
  const std::string &first = rotated.kernels[0].source, &second = rotated.kernels[1].source;
  // Launch 1 quantizes Q, launch 2 K (after mean(K) and q_mean); both rotate.
  CHECK(first.find("quantizeRotatedQBlockOf<QBlock, QQuantizer>(params, cta, shared);") != std::string::npos);
  CHECK(first.find("// ---- begin sage/device/prologue/rotation.cuh ----") != std::string::npos);
  CHECK(first.find("kRotationSigns0 = 0xe220a8397b1dcdafull") != std::string::npos); // SplitMix64(0)'s first word
  CHECK(first.find("kRotationScaleQ = 0.125f") != std::string::npos);                // d = 128: 2^-3 and 2^-4
  CHECK(first.find("kRotationScaleK = 0.0625f") != std::string::npos);
  // psi_K of the rotated x, after Q smoothing's correction took the unrotated one (k_quantize.cuh's order).
  CHECK(second.find("kQMeanCorrection = true, kRotated = true") != std::string::npos);
  CHECK(second.find("kPerTensor = false") != std::string::npos);
  // Without rotation nothing of it is emitted.
  for (const codegen::PrologueKernel &kernel : plain.kernels) {
    CHECK(kernel.source.find("// ---- begin sage/device/prologue/rotation.cuh") == std::string::npos);
    CHECK(kernel.source.find("kRotationSigns") == std::string::npos);
    CHECK(kernel.source.find("kRotated = true") == std::string::npos);
  }
}

TEST_CASE("rotation: the generator refuses what the prologue cannot rotate, with the reason") {
  AttentionVariant variant = prologue_test::makeVariant(kindNamed("per_tensor_unsmoothed_f16_v"), 64);
  variant.q.rotation_seed = 1;
  variant.k.rotation_seed = 1;
  CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(variant, InputType::f16, 64),
                       doctest::Contains("rotation_seed: rotation: a per-tensor Q scale"), std::invalid_argument);
  variant = prologue_test::makeVariant(kindNamed("per_block_smooth_k_f16_v"), 64);
  variant.q.rotation_seed = 1;
  variant.k.rotation_seed = 2;
  CHECK_THROWS_WITH_AS(codegen::PrologueGenerator::generate(variant, InputType::f16, 64),
                       doctest::Contains("Q and K must be rotated with the same seed"), std::invalid_argument);
}
