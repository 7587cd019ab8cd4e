// The backward program (SageBwd, issue 12; K smoothing, issue 25): presets round-trip through the text, the steps are
// named, and each verifier rule fires with its message at its line.
#include "sage/dsl/AttentionBackward.h"
#include "sage/ir/BackwardProgram.h"

#include "IrEdits.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace sage;

namespace {

using namespace sage::ir_test;

const std::string &kValidProgram = kSageBwdCausalProgram;

const std::string kKInt8 = "%k_int8 = sage.bwd_quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}";
const std::string kDoInt8 = "%do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 64 : i64}";

const std::vector<RuleCase> kRules = {
    {"unsupported IR version", {{"version(1)", "version(7)"}}, "IR version 7 is not supported", 1},
    {"block_kv not a multiple of 16",
     {{"block_kv(64)", "block_kv(100)"}},
     "block_kv must be a positive multiple of 16",
     1},
    {"D from the wrong operands",
     {{"sage.bwd_row_dot %do, %o", "sage.bwd_row_dot %o, %do"}},
     "its first operand must be 'sage.bwd_input do'",
     8},
    {"an e4m3 quantizer",
     {{"%q to int8 per_block", "%q to e4m3 per_block"}},
     "the backward quantizes to int8 (or casts to f16, bf16, f32), not 'e4m3'",
     10},
    {"a cast with a scale", {{"%do to f16 none", "%do to f16 per_token"}}, "takes no scale", 18},
    {"P quantized per channel",
     {{"%p to int8 per_block", "%p to int8 per_channel"}},
     "int8 P takes one scale per b_q x b_kv tile (per_block) or one per token of its product's output (per_token)",
     15},
    {"per-token dS shared by dQ and dK",
     {{"%ds to int8 per_block", "%ds to int8 per_token"}},
     "the dq and dk products each need their own sage.bwd_quantize",
     22},
    {"a group of P's tile",
     {{"%p to int8 per_block", "%p to int8 per_block {group_tokens = 16 : i64}"}},
     "group_tokens is only meaningful for per_block Q, K, V and dO",
     15},
    {"K's group does not divide the tile",
     {{kKInt8, "%k_int8 = sage.bwd_quantize %k_smoothed to int8 per_block {group_tokens = 48 : i64}"}},
     "group_tokens 48 must divide the K tile of 64 tokens",
     11},
    {"per-token K in dQ = dS.K",
     {{kKInt8, "%k_int8 = sage.bwd_quantize %k_smoothed to int8 per_token"}},
     "the dq product sums over the key tokens of a KV tile: K's scale must be one per tile",
     23},
    {"dO scaled per half tile in dV = P^T.dO",
     {{kDoInt8, "%do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 32 : i64}"}},
     "the dv product sums over the query tokens of a Q tile: dO's scale must be one per tile",
     17},
    {"mixed operand types",
     {{"sage.bwd_mma %do_f16, %v_f16", "sage.bwd_mma %do_int8, %v_f16"}},
     "operand types int8 and f16 cannot be mixed",
     20},
    {"an f16 product into s32",
     {{"sage.bwd_mma %do_f16, %v_f16 -> f32", "sage.bwd_mma %do_f16, %v_f16 -> s32"}},
     "the dp product of f16 operands accumulates in f32, not 's32'",
     20},
    {"a product that is none of the five",
     {{"sage.bwd_mma %ds_int8, %k_int8", "sage.bwd_mma %ds_int8, %p_int8"}},
     "multiplies dS by P; expected Q by K (S)",
     23},
    {"an mma of unquantized operands",
     {{"sage.bwd_mma %q_int8, %k_int8", "sage.bwd_mma %q, %k_int8"}},
     "operands must come from sage.bwd_quantize",
     12},
    {"a mask of something else",
     {{"sage.bwd_mask %s causal", "sage.bwd_mask %q_int8 causal"}},
     "masks the recomputed scores",
     13},
    {"a block-sparse mask",
     {{"sage.bwd_mask %s causal", "sage.bwd_mask %s block_sparse"}},
     "the backward supports masks 'none' and 'causal', not 'block_sparse'",
     13},
    {"P from O instead of the LSE",
     {{"sage.bwd_recompute_p %s_masked, %lse", "sage.bwd_recompute_p %s_masked, %o"}},
     "its second operand must be 'sage.bwd_input lse', got O",
     14},
    {"dS from the quantized P",
     {{"sage.bwd_ds %p, %dp", "sage.bwd_ds %p_int8, %dp"}},
     "dS = P o (dP - D) takes the unquantized P",
     21},
    {"writing S as a gradient",
     {{"sage.bwd_write_grad %dv as f32", "sage.bwd_write_grad %s as f32"}},
     "writes a gradient: its operand must be the dQ, dK or dV sage.bwd_mma, got the scores S",
     27},
    {"an f16 gradient accumulator",
     {{"sage.bwd_write_grad %dq as f32", "sage.bwd_write_grad %dq as f16"}},
     "gradients accumulate over tiles in f32, not 'f16'",
     25},
    {"dQ written twice",
     {{"sage.bwd_write_grad %dv as f32", "sage.bwd_write_grad %dq as f32"}},
     "expects exactly one sage.bwd_write_grad of dQ, found 2",
     1},
    {"two dQ products and no dK",
     {{"%dk = sage.bwd_mma %ds_int8, %q_int8", "%dk = sage.bwd_mma %ds_int8, %k_int8"}},
     "expects exactly one dq product (sage.bwd_mma), found 2",
     1},
    {"Q smoothed",
     {{"sage.bwd_smooth %k over sequence", "sage.bwd_smooth %q over sequence"}},
     "smooths K (K - mean(K)): its operand must be 'sage.bwd_input k', got Q",
     9},
    {"K smoothed per block",
     {{"sage.bwd_smooth %k over sequence", "sage.bwd_smooth %k over block"}},
     "scope must be 'sequence', got 'block'",
     9},
    {"the LSE not shifted for the smoothed K",
     {{"%lse {smoothing_shift}", "%lse"}},
     "P needs the LSE shifted by q . mean(K) / sqrt(d) ({smoothing_shift})",
     14},
    {"a shift without smoothing",
     {{"  %k_smoothed = sage.bwd_smooth %k over sequence\n", ""}, {"%k_smoothed to int8", "%k to int8"}},
     "{smoothing_shift} shifts the LSE by q . mean(K) / sqrt(d), but S is recomputed from K unsmoothed",
     13},
    {"dQ from K unsmoothed while S takes the smoothed K",
     {{"  %dq = sage.bwd_mma %ds_int8, %k_int8 -> s32",
       "  %k_raw = sage.bwd_quantize %k to int8 per_block {group_tokens = 64 : i64}\n"
       "  %dq = sage.bwd_mma %ds_int8, %k_raw -> s32"}},
     "quantizes K unsmoothed, but K is smoothed (sage.bwd_smooth): S and dQ = dS.K both take the smoothed K",
     23},
    {"K smoothed twice",
     {{"  %q_int8 = ", "  %k_again = sage.bwd_smooth %k over sequence\n  %q_int8 = "}},
     "expects at most one sage.bwd_smooth (of K), found 2",
     1},
    {"an unknown attribute",
     {{"%s = sage.bwd_mma %q_int8, %k_int8 -> s32", "%s = sage.bwd_mma %q_int8, %k_int8 -> s32 {bogus}"}},
     "unknown attribute 'bogus'",
     12},
};

} // namespace

TEST_CASE("the valid backward program parses and lowers to the sagebwd preset") {
  const ir::BackwardProgram program = ir::BackwardProgram::parse(kValidProgram, "valid.mlir");
  BackwardVariant expected = dsl::backwardPreset("sagebwd", 128, MaskKind::causal)->describe();
  expected.name = "b";
  CHECK(program.variant() == expected);
  CHECK(program.print() == kValidProgram);
}

TEST_CASE("each backward verifier rule reports its message at its line") { checkBackwardRules(kRules, kValidProgram); }

TEST_CASE("per-token P and dS scales (token_scales): printed, parsed, and dS quantized once per product") {
  for (bool rotated : {false, true}) {
    CAPTURE(rotated);
    dsl::AttentionBackwardBuilder builder = *dsl::backwardPreset(rotated ? "sagebwd-rot" : "sagebwd");
    builder.token_scales();
    const ir::BackwardProgram program = builder.build();
    const BackwardVariant variant = program.variant();
    CHECK(variant == builder.describe());
    for (BackwardProduct product : {BackwardProduct::dv, BackwardProduct::dq, BackwardProduct::dk}) {
      CAPTURE(nameOf(product));
      CHECK(variant.product(product).lhs == QuantizerSpec{ElementType::int8, Granularity::per_token});
    }
    const std::string text = program.print();
    CHECK(text.find("%p to int8 per_token") != std::string::npos);
    const size_t first = text.find("%ds to int8 per_token"), second = text.rfind("%ds to int8 per_token");
    CHECK(first != std::string::npos);
    CHECK(first != second); // dQ's codes (per query) and dK's (per key)
    const ir::BackwardProgram reparsed = ir::BackwardProgram::parse(text, "token_scales.mlir");
    CHECK(reparsed.print() == text);
    CHECK(reparsed.variant() == variant);
    CHECK(reparsed.fingerprint() != dsl::backwardPreset(rotated ? "sagebwd-rot" : "sagebwd")->build().fingerprint());
  }
  // A hand-written program with two per-token dS quantizers verifies.
  std::string text = applyEdits(kValidProgram, {{"  %ds_int8 = sage.bwd_quantize %ds to int8 per_block\n",
                                                 "  %ds_int8 = sage.bwd_quantize %ds to int8 per_token\n"
                                                 "  %ds_k = sage.bwd_quantize %ds to int8 per_token\n"},
                                                {"sage.bwd_mma %ds_int8, %q_int8", "sage.bwd_mma %ds_k, %q_int8"}});
  CHECK(ir::BackwardProgram::parse(text).variant().product(BackwardProduct::dk).lhs.granularity ==
        Granularity::per_token);
}

TEST_CASE("forward and backward programs stay apart") {
  const std::string forward = dsl::preset("sagebwd", 128, MaskKind::causal)->build().print();
  CHECK_THROWS_WITH_AS(ir::BackwardProgram::parse(forward), doctest::Contains("a backward program holds one"),
                       ir::ProgramError);
  CHECK_THROWS_WITH_AS(ir::Program::parse(kValidProgram), doctest::Contains("a sage program holds one sage.attention"),
                       ir::ProgramError);
  // A backward op inside a forward program.
  std::string mixed = forward;
  mixed.insert(mixed.find("  %k = sage.input k"), "  %lse = sage.bwd_input lse\n");
  CHECK_THROWS_WITH_AS(ir::Program::parse(mixed), doctest::Contains("expects parent op 'sage.attention_backward'"),
                       ir::ProgramError);
  CHECK(ir::looksLikeBackwardProgram(kValidProgram));
  CHECK_FALSE(ir::looksLikeBackwardProgram(forward));
  // The parser's input bounds hold here too.
  CHECK_THROWS_WITH_AS(ir::BackwardProgram::parse(std::string("sage.attention_backward\0", 24)),
                       doctest::Contains("NUL byte"), ir::ProgramError);
}

TEST_CASE("every backward preset round-trips through the textual IR") {
  for (const dsl::PresetInfo &info : dsl::backwardPresets())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
        const std::string name(info.name);
        CAPTURE(name);
        CAPTURE(head_dim);
        const dsl::AttentionBackwardBuilder builder = *dsl::backwardPreset(info.name, head_dim, mask);
        const ir::BackwardProgram program = builder.build();
        const std::string text = program.print();
        const ir::BackwardProgram reparsed = ir::BackwardProgram::parse(text, "roundtrip.mlir");
        CHECK(reparsed.print() == text);
        CHECK(reparsed.fingerprint() == program.fingerprint());
        CHECK(reparsed.variant() == builder.describe());
        CHECK((text.find("sage.bwd_mask") != std::string::npos) == (mask == MaskKind::causal));
      }
  CHECK_FALSE(dsl::backwardPreset("sagebwd-x").has_value());
}

TEST_CASE("the presets: Algorithm 3, its dO.V^T ablation, and the exact backward") {
  const BackwardVariant sagebwd = dsl::backwardPreset("sagebwd")->describe();
  for (BackwardProduct product : {BackwardProduct::s, BackwardProduct::dv, BackwardProduct::dq, BackwardProduct::dk}) {
    CAPTURE(nameOf(product));
    CHECK(sagebwd.product(product).lhs.dtype == ElementType::int8);
    CHECK(sagebwd.product(product).rhs.dtype == ElementType::int8);
    CHECK(sagebwd.product(product).accumulator == AccumulatorType::s32);
  }
  CHECK(sagebwd.product(BackwardProduct::dp).lhs.dtype == ElementType::f16);
  CHECK(sagebwd.product(BackwardProduct::dp).accumulator == AccumulatorType::f32);
  CHECK(sagebwd.product(BackwardProduct::dv).lhs.group_tokens == 0); // P: one scale per tile
  CHECK(sagebwd.product(BackwardProduct::dq).rhs == sagebwd.product(BackwardProduct::s).rhs);

  const BackwardVariant ablation = dsl::backwardPreset("sagebwd-int8-dp")->describe();
  CHECK(ablation.product(BackwardProduct::dp).lhs.dtype == ElementType::int8);
  CHECK(ablation.product(BackwardProduct::dp).rhs.granularity == Granularity::per_block);

  // Q and K codes are shared by S and dK / dQ: one quantizer each in the text.
  const std::string text = dsl::backwardPreset("sagebwd")->build().print();
  CHECK(text.find("%q_int8 = ") == text.rfind("%q_int8 = "));
  CHECK(text.find("sage.bwd_mma %ds_int8, %k_int8") != std::string::npos);
  CHECK(text.find("sage.bwd_mma %ds_int8, %q_int8") != std::string::npos);

  // K smoothing (issue 25): on in sagebwd and its ablation, off in exact-bwd and with smooth_k(false).
  CHECK(sagebwd.smooth_k == SmoothScope::sequence);
  CHECK(ablation.smooth_k == SmoothScope::sequence);
  CHECK(text.find("%k_int8 = sage.bwd_quantize %k_smoothed") != std::string::npos);
  CHECK(text.find("sage.bwd_recompute_p %s, %lse {smoothing_shift}") != std::string::npos);
  const ir::BackwardProgram unsmoothed = dsl::backwardPreset("sagebwd")->smooth_k(false).build();
  CHECK(unsmoothed.variant().smooth_k == SmoothScope::none);
  CHECK(unsmoothed.print().find("smooth") == std::string::npos);
  CHECK(ir::BackwardProgram::parse(unsmoothed.print()).variant() == unsmoothed.variant());
  CHECK(unsmoothed.fingerprint() != dsl::backwardPreset("sagebwd")->build().fingerprint());
  CHECK(dsl::backwardPreset("exact-bwd")->describe().smooth_k == SmoothScope::none);

  CHECK(dsl::backwardPreset("exact-bwd")->describe().product(BackwardProduct::dq).lhs.dtype == ElementType::f32);
  CHECK(dsl::backwardPresetForward("sagebwd") == "sagebwd");
  CHECK(dsl::backwardPresetForward("exact-bwd") == "exact");
  CHECK(dsl::attention_backward().float_type(ElementType::bf16).describe().product(BackwardProduct::dp).lhs.dtype ==
        ElementType::bf16);
  CHECK_THROWS_WITH_AS(dsl::attention_backward().mask(MaskKind::block_sparse), doctest::Contains("not block_sparse"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(dsl::attention_backward().blocks(64, 40), doctest::Contains("block_kv must be"),
                       std::invalid_argument);
}
