// One case per verifier rule: a valid program with one edit, the message it must produce, and where.
#include "IrEdits.h"
#include "sage/ir/Program.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

using namespace sage::ir_test;
const std::string &kValidProgram = kSageBCausalLseProgram;

const std::vector<RuleCase> kRules = {
    // sage.attention attributes
    {"unsupported IR version", {{"version(1)", "version(7)"}}, "IR version 7 is not supported", 1},
    {"head_dim not a multiple of 16", {{"head_dim(128)", "head_dim(100)"}}, "head_dim must be a positive multiple", 1},
    {"block_q not a multiple of 16",
     {{"block_q(128)", "block_q(100)"}},
     "block_q must be a positive multiple of 16",
     1},
    {"block_kv zero", {{"block_kv(64)", "block_kv(0)"}}, "block_kv must be a positive multiple of 16", 1},
    // whole-program rules
    {"a second input q",
     {{"  %v = sage.input v\n", "  %v = sage.input v\n  %q2 = sage.input q\n"}},
     "expects exactly one 'sage.input q', found 2",
     1},
    {"no epilogue", {{"  sage.write_o %o\n", ""}}, "has no epilogue: expected a 'sage.write_o'", 1},
    {"O written twice", {{"  sage.write_o %o\n", "  sage.write_o %o\n  sage.write_o %o\n"}}, "writes O 2 times", 1},
    {"LSE written twice",
     {{"  sage.write_lse %p {smoothing_correction}\n",
       "  sage.write_lse %p {smoothing_correction}\n  sage.write_lse %p {smoothing_correction}\n"}},
     "at most one sage.write_lse",
     1},
    {"two masks",
     {{"%p = sage.online_softmax %s_masked",
       "%s_other = sage.mask %s_dequant causal\n  %p = sage.online_softmax %s_masked"}},
     "at most one sage.mask",
     1},
    {"a mask of masked scores", // refused at the op (issue 26: a chain of masks made verifying quadratic)
     {{"%p = sage.online_softmax %s_masked",
       "%s_twice = sage.mask %s_masked causal\n  %p = sage.online_softmax %s_twice"}},
     "masks scores a sage.mask already masked",
     11},
    {"a quantizer of a quantizer", // refused at the op (issue 26: a chain of casts made verifying quadratic)
     {{"%v_f16 = sage.quantize %v to f16 none",
       "%v_f32 = sage.quantize %v to f32 none\n  %v_f16 = sage.quantize %v_f32 to f16 none"}},
     "quantizes the result of 'sage.quantize': Q, K, V and P are quantized once",
     14},
    {"an unused quantizer of K", // it would have set K's type in the variant (issue 26)
     {{"  %s = sage.mma",
       "  %k_e4m3 = sage.quantize %k_smoothed to e4m3 per_block {group_tokens = 64 : i64}\n  %s = sage.mma"}},
     "computes a value nothing uses",
     8},
    {"an unused smoothing of V", // it would have added mean(V) in the epilogue (issue 26)
     {{"  %s = sage.mma", "  %v_smoothed = sage.smooth %v over sequence\n  %s = sage.mma"}},
     "computes a value nothing uses",
     8},
    {"two softmaxes",
     {{"  %p_f16 =", "  %p2 = sage.online_softmax %s_masked exp2 state f32\n  %p_f16 ="}},
     "exactly one sage.online_softmax",
     1},
    {"two accumulations",
     {{"  %o = sage.normalize", "  %o2 = sage.accumulate %pv as f16\n  %o = sage.normalize"}},
     "exactly one sage.accumulate",
     1},
    {"a third mma",
     {{"  %s_dequant =", "  %s2 = sage.mma %q_int8, %k_int8 -> s32\n  %s_dequant ="}},
     "one Q.K^T mma and one P.V mma, found 2 and 1",
     1},
    {"K smoothed twice",
     {{"  %q_int8 =", "  %k_again = sage.smooth %k over sequence\n  %q_int8 ="}},
     "smooths K a second time",
     6},
    {"LSE without the smoothing correction",
     {{"sage.write_lse %p {smoothing_correction}", "sage.write_lse %p"}},
     "K is smoothed, so the LSE must add q.mean(K) back",
     18},
    {"smoothing correction without smoothing",
     {{"  %k_smoothed = sage.smooth %k over sequence\n", ""},
      {"%k_int8 = sage.quantize %k_smoothed", "%k_int8 = sage.quantize %k"}},
     "smoothing_correction is set but K is not smoothed",
     17},
    {"folded scale with an exp softmax",
     {{"exp2 state f32", "exp state f32"}},
     "folds log2(e) into Q for the exp2 softmax",
     6},
    // sage.smooth
    {"smoothing a quantized value",
     {{"  %p_f16 =", "  %bad = sage.smooth %q_int8 over block\n  %p_f16 ="}},
     "its operand must come from sage.input",
     12},
    {"K smoothed per block",
     {{"sage.smooth %k over sequence", "sage.smooth %k over block"}},
     "smoothing K is over the sequence",
     5},
    {"Q smoothed over the sequence",
     {{"  %q_int8 = sage.quantize %q ", "  %q_s = sage.smooth %q over sequence\n  %q_int8 = sage.quantize %q_s "}},
     "smoothing Q is over the block",
     6},
    // sage.quantize
    {"a cast with a granularity", {{"%v to f16 none", "%v to f16 per_channel"}}, "casting to f16 takes no scale", 13},
    {"a cast with a static scale",
     {{"%v to f16 none", "%v to f16 none {static_scale = 0.5 : f64}"}},
     "takes no static_scale",
     13},
    {"int8 without a scale", {{"%v to f16 none", "%v to int8 none"}}, "quantizing to int8 needs a scale", 13},
    {"e2m1 without microscales",
     {{"%v to f16 none", "%v to e2m1 per_channel"}},
     "e2m1 (FP4) values and microscale_1x16 scales go together",
     13},
    {"ue4m3 scales without microscales",
     {{"%v to f16 none", "%v to int8 per_channel {scale_type = #sage<scale_type ue4m3>}"}},
     "scale_type ue4m3 is the microscale_1x16 scale type",
     13},
    {"group_tokens on per_token",
     {{"%v to f16 none", "%v to int8 per_channel {group_tokens = 4 : i64}"}},
     "group_tokens is only meaningful for per_block",
     13},
    {"per_block without a group",
     {{"per_block {group_tokens = 64 : i64}", "per_block"}},
     "needs group_tokens in [1, 1024]",
     7},
    {"per_thread group not a multiple of 8",
     {{"per_block {group_tokens = 64 : i64}", "per_thread {group_tokens = 12 : i64}"}},
     "per_thread interleaves tokens by 8",
     7},
    {"group not dividing the tile",
     {{"per_block {group_tokens = 64 : i64}", "per_block {group_tokens = 48 : i64}"}},
     "group_tokens 48 must divide the K tile of 64 tokens",
     7},
    {"quantizing the scores",
     {{"  %s_dequant = sage.dequant %s\n",
       "  %s_dequant = sage.dequant %s\n  %bad = sage.quantize %s to int8 per_token\n"}},
     "quantizes the scores S; expected Q, K, V or P",
     10},
    {"per_channel K",
     {{"per_block {group_tokens = 64 : i64}", "per_channel"}},
     "per_channel scales of K lie on the inner axis",
     7},
    {"per_token V", {{"%v to f16 none", "%v to int8 per_token"}}, "V's token axis is the inner axis of P.V", 13},
    {"per_block P",
     {{"%p to f16 none", "%p to int8 per_block {group_tokens = 64 : i64}"}},
     "P is quantized row by row",
     12},
    {"per_tensor P without a static scale",
     {{"%p to f16 none", "%p to int8 per_tensor"}},
     "per_tensor P needs a static_scale",
     12},
    {"int4 V", {{"%v to f16 none", "%v to int4 per_channel"}}, "int4 is for Q and K", 13},
    {"a static scale on K",
     {{"per_block {group_tokens = 64 : i64}", "per_tensor {static_scale = 0.5 : f64}"}},
     "a static_scale is only valid for P",
     7},
    {"a negative static scale",
     {{"%p to f16 none", "%p to int8 per_tensor {static_scale = -1.0 : f64}"}},
     "static_scale must lie in [2^-64, 2^64]",
     12},
    {"a static scale per token",
     {{"%p to f16 none", "%p to int8 per_token {static_scale = 0.5 : f64}"}},
     "granularity must be 'per_tensor'",
     12},
    {"two-level int8 P",
     {{"%p to f16 none", "%p to int8 per_token {two_level}"}},
     "two_level scaling is SageAttention3's",
     12},
    {"folded softmax scale on K",
     {{"per_block {group_tokens = 64 : i64}", "per_block {fold_softmax_scale, group_tokens = 64 : i64}"}},
     "fold_softmax_scale multiplies Q",
     7},
    {"ue8m0 scales with 1x16 microscales",
     {{"%v to f16 none", "%v to e2m1 microscale_1x16 {scale_type = #sage<scale_type ue8m0>}"}},
     "scale_type ue4m3 is the microscale_1x16 scale type (NVFP4) and only that; got scale_type 'ue8m0'",
     13},
    {"ue8m0 scales without microscales",
     {{"%v to f16 none", "%v to int8 per_channel {scale_type = #sage<scale_type ue8m0>}"}},
     "scale_type ue8m0 is the microscale_1x32 scale type (MXFP4)",
     13},
    {"MXFP4 Q with a head_dim that 32 does not divide",
     {{"head_dim(128)", "head_dim(80)"},
      {"%q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}",
       "%q to e2m1 microscale_1x32 {fold_softmax_scale, scale_type = #sage<scale_type ue8m0>}"}},
     "microscale_1x32 groups 32 elements along head_dim of Q: head_dim must be a multiple of 32, got 80",
     6},
    {"MXFP4 V with a KV tile that 32 does not divide",
     {{"block_kv(64)", "block_kv(48)"},
      {"per_block {group_tokens = 64 : i64}", "per_block {group_tokens = 48 : i64}"},
      {"%v to f16 none", "%v to e2m1 microscale_1x32 {scale_type = #sage<scale_type ue8m0>}"}},
     "groups 32 elements along the KV tile of V: block_kv must be a multiple of 32, got 48",
     13},
    {"two-level MXFP4 P",
     {{"%p to f16 none", "%p to e2m1 microscale_1x32 {scale_type = #sage<scale_type ue8m0>, two_level}"}},
     "it needs P in e2m1 with microscale_1x16",
     12},
    // sage.decode
    {"decoding a raw input",
     {{"  %s = sage.mma", "  %bad = sage.decode %q to int8\n  %s = sage.mma"}},
     "its operand must come from sage.quantize",
     8},
    {"decoding int8 codes",
     {{"  %s = sage.mma", "  %bad = sage.decode %q_int8 to f16\n  %s = sage.mma"}},
     "only e2m1 and int4 codes are decoded",
     8},
    {"decoding int4 codes to f16",
     {{"%q to int8 per_block", "%q to int4 per_block"},
      {"%k_smoothed to int8 per_block", "%k_smoothed to int4 per_block"},
      {"  %s = sage.mma", "  %bad = sage.decode %q_int8 to f16\n  %s = sage.mma"}},
     "decoding int4 with per_block scales gives int8 (int4 codes are int8 codes), not 'f16'",
     8},
    // sage.q_mean_correction
    {"Q smoothed without the GEMV correction",
     {{"  %q_int8 = sage.quantize %q ", "  %q_s = sage.smooth %q over block\n  %q_int8 = sage.quantize %q_s "}},
     "Q is smoothed, so S needs exactly one 'sage.q_mean_correction'",
     1},
    {"a GEMV correction without Q smoothing",
     {{"%s_masked = sage.mask %s_dequant causal",
       "%s_c = sage.q_mean_correction %s_dequant, mean(%q), %k_smoothed\n  %s_masked = sage.mask %s_c causal"}},
     "its second operand must be the sage.smooth of Q",
     10},
    {"a GEMV correction with quantized K",
     {{"  %q_int8 = sage.quantize %q ", "  %q_s = sage.smooth %q over block\n  %q_int8 = sage.quantize %q_s "},
      {"%s_masked = sage.mask %s_dequant causal",
       "%s_c = sage.q_mean_correction %s_dequant, mean(%q_s), %k_int8\n  %s_masked = sage.mask %s_c causal"}},
     "its third operand must be the sage.input of K or its sage.smooth",
     11},
    {"a GEMV correction of the softmax",
     {{"  %q_int8 = sage.quantize %q ", "  %q_s = sage.smooth %q over block\n  %q_int8 = sage.quantize %q_s "},
      {"  %p_f16 =", "  %bad = sage.q_mean_correction %p, mean(%q_s), %k_smoothed\n  %p_f16 ="}},
     "its first operand must be the Q.K^T mma or its sage.dequant",
     13},
    // sage.mma
    {"an operand that is not quantized",
     {{"sage.mma %q_int8, %k_int8", "sage.mma %q_int8, %k_smoothed"}},
     "operands must come from sage.quantize",
     8},
    {"K times Q", {{"sage.mma %q_int8, %k_int8", "sage.mma %k_int8, %q_int8"}}, "multiplies K by Q", 8},
    {"mixed operand types",
     {{"%v to f16 none", "%v to e4m3 per_channel"}},
     "operand types f16 and e4m3 cannot be mixed",
     14},
    {"int8 with an f16 accumulator",
     {{"%k_int8 -> s32", "%k_int8 -> f16"}},
     "mma of int8 operands accumulates in s32",
     8},
    {"f16 with an s32 accumulator",
     {{"%v_f16 -> f16", "%v_f16 -> s32"}},
     "mma of f16 operands accumulates in f16 or f32",
     14},
    // sage.dequant
    {"dequantizing a non-mma",
     {{"%s_dequant = sage.dequant %s\n", "%s_dequant = sage.dequant %q_int8\n"}},
     "dequantizes the result of a sage.mma",
     9},
    {"dequantizing unscaled operands",
     {{"  %o_accumulated = sage.accumulate %pv", "  %pv_d = sage.dequant %pv\n  %o_accumulated = sage.accumulate %pv"}},
     "nothing to dequantize",
     15},
    // sage.mask
    {"masking P",
     {{"  %p_f16 =", "  %bad = sage.mask %p causal\n  %p_f16 ="}},
     "masks the scores S = Q.K^T; its operand is P",
     12},
    // sage.online_softmax
    {"an f16 softmax state", {{"exp2 state f32", "exp2 state f16"}}, "kept in f32, got state 'f16'", 11},
    {"softmax of V", {{"sage.online_softmax %s_masked", "sage.online_softmax %v"}}, "its operand is V", 11},
    {"softmax before dequantization",
     {{"%s_masked = sage.mask %s_dequant causal", "%s_masked = sage.mask %s causal"}},
     "must pass through sage.dequant before the softmax",
     11},
    // sage.accumulate
    {"accumulating the scores",
     {{"sage.accumulate %pv as f16", "sage.accumulate %s_dequant as f16"}},
     "accumulates the P.V product; its operand is the scores S",
     15},
    {"f16 accumulation of an f32 mma",
     {{"%v_f16 -> f16", "%v_f16 -> f32"}},
     "needs a P.V mma that accumulates in f16",
     15},
    {"f32 accumulation of an f16 mma",
     {{"sage.accumulate %pv as f16", "sage.accumulate %pv as f32"}},
     "use accumulation 'f16' or 'f16_then_f32'",
     15},
    {"quantized P.V without dequant",
     {{"%p to f16 none", "%p to int8 per_tensor {static_scale = 0.0078125 : f64}"},
      {"%v to f16 none", "%v to int8 per_channel"},
      {"%v_f16 -> f16", "%v_f16 -> s32"},
      {"sage.accumulate %pv as f16", "sage.accumulate %pv as f32"}},
     "must pass through sage.dequant before accumulation",
     15},
    {"two-level without a flush period",
     {{"sage.accumulate %pv as f16", "sage.accumulate %pv as f16_then_f32"}},
     "f16_then_f32 needs flush_period in [1, 1048576]",
     15},
    {"a flush period on plain f16",
     {{"sage.accumulate %pv as f16", "sage.accumulate %pv as f16 {flush_period = 4 : i64}"}},
     "flush_period only applies to the two-level",
     15},
    // epilogue
    {"normalizing the mma",
     {{"sage.normalize %o_accumulated by %p", "sage.normalize %pv by %p"}},
     "its first operand must come from sage.accumulate",
     16},
    {"normalizing by the scores",
     {{"sage.normalize %o_accumulated by %p", "sage.normalize %o_accumulated by %s_masked"}},
     "its second operand must come from sage.online_softmax",
     16},
    {"writing the unnormalized O",
     {{"sage.write_o %o", "sage.write_o %o_accumulated"}},
     "its operand must come from sage.normalize",
     17},
    {"LSE of the output", {{"sage.write_lse %p {", "sage.write_lse %o {"}}, "writes the LSE of the softmax", 18},
    // the randomized Hadamard rotation (issue 28)
    {"only Q rotated",
     {{"{fold_softmax_scale, group_tokens = 128 : i64}", "{fold_softmax_scale, group_tokens = 128 : i64, "
                                                         "rotation_seed = 3 : i64}"}},
     "Q and K must be rotated with the same seed, or neither",
     6},
    {"Q and K rotated with different seeds",
     {{"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = 3 : i64}"},
      {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = 4 : i64}"}},
     "Q's rotation_seed is 3, K's 4",
     6},
    {"rotated V",
     {{"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = 3 : i64}"},
      {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = 3 : i64}"},
      {"%v to f16 none", "%v to f16 none {rotation_seed = 3 : i64}"}},
     "V cannot be rotated",
     13},
    {"a negative rotation seed",
     {{"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = -1 : i64}"},
      {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = -1 : i64}"}},
     "rotation_seed must lie in [0, 2^32 - 1], got -1",
     6},
    {"a rotation seed past 32 bits",
     {{"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = 4294967296 : i64}"},
      {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = 4294967296 : i64}"}},
     "rotation_seed must lie in [0, 2^32 - 1], got 4294967296",
     6},
    {"a rotated cast",
     {{"%q_int8 = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}",
       "%q_int8 = sage.quantize %q to f16 none {rotation_seed = 1 : i64}"},
      {"%k_int8 = sage.quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}",
       "%k_int8 = sage.quantize %k_smoothed to f16 none {rotation_seed = 1 : i64}"},
      {"%k_int8 -> s32", "%k_int8 -> f32"},
      {"  %s_dequant = sage.dequant %s\n", ""},
      {"sage.mask %s_dequant causal", "sage.mask %s causal"}},
     "a cast to f16 has no scale to protect",
     6},
    {"rotation at a head_dim that is no power of two",
     {{"head_dim(128)", "head_dim(96)"},
      {"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = 3 : i64}"},
      {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = 3 : i64}"}},
     "head_dim must be a power of two in [16, 256], got 96",
     6},
};

} // namespace

TEST_CASE("the unedited program is valid") { CHECK_NOTHROW(sage::ir::Program::parse(kValidProgram, "test.mlir")); }

TEST_CASE("Q and K rotated with one seed verify") {
  const std::string text =
      applyEdits(kValidProgram, {{"group_tokens = 128 : i64}", "group_tokens = 128 : i64, rotation_seed = 7 : i64}"},
                                 {"group_tokens = 64 : i64}", "group_tokens = 64 : i64, rotation_seed = 7 : i64}"}});
  const sage::AttentionVariant variant = sage::ir::Program::parse(text, "test.mlir").variant();
  CHECK(variant.q.rotation_seed == 7u);
  CHECK(variant.k.rotation_seed == 7u);
  CHECK_FALSE(variant.v.rotation_seed.has_value());
}

TEST_CASE("every verifier rule reports its message at its location") {
  for (const RuleCase &rule : kRules) {
    const std::string rule_name = rule.rule;
    CAPTURE(rule_name);
    const std::string text = applyEdits(kValidProgram, rule.edits);
    bool reported = false;
    try {
      sage::ir::Program::parse(text, "test.mlir");
    } catch (const sage::ir::ProgramError &error) {
      const std::string expected_location = "test.mlir:" + std::to_string(rule.line) + ":";
      for (const auto &diagnostic : error.diagnostics())
        if (diagnostic.message.find(rule.message) != std::string::npos) {
          reported = true;
          CHECK(diagnostic.location.rfind(expected_location, 0) == 0);
          CHECK(diagnostic.text().find(expected_location) == 0);
        }
      if (!reported)
        FAIL_CHECK("expected '" << std::string(rule.message) << "', got: " << std::string(error.what()));
      continue;
    }
    FAIL_CHECK("the edited program verified: " << text);
  }
}

TEST_CASE("syntax errors and top-level mistakes are reported with locations") {
  SUBCASE("an unknown keyword") {
    try {
      sage::ir::Program::parse(applyEdits(kValidProgram, {{"to int8 per_block {fold", "to int9 per_block {fold"}}),
                               "x.mlir");
      FAIL("parsed");
    } catch (const sage::ir::ProgramError &error) {
      CHECK(error.diagnostics().front().location.rfind("x.mlir:6:", 0) == 0);
    }
  }
  SUBCASE("two variants in one file") {
    CHECK_THROWS_WITH_AS(sage::ir::Program::parse(kValidProgram + applyEdits(kValidProgram, {{"@t", "@u"}}), "x.mlir"),
                         doctest::Contains("x.mlir:21:3: error: %q is defined a second time (first at x.mlir:2:3): a "
                                           "file holds one sage program"),
                         sage::ir::ProgramError);
    // With distinct value names the top-level rule reports it.
    std::string renamed = applyEdits(kValidProgram, {{"@t", "@u"}});
    for (size_t at = renamed.find('%'); at != std::string::npos; at = renamed.find('%', at + 3))
      renamed.replace(at, 1, "%u_");
    CHECK_THROWS_WITH_AS(sage::ir::Program::parse(kValidProgram + renamed, "x.mlir"),
                         doctest::Contains("exactly one sage.attention, found 2"), sage::ir::ProgramError);
  }
  SUBCASE("an empty file") {
    CHECK_THROWS_WITH_AS(sage::ir::Program::parse("", "x.mlir"),
                         doctest::Contains("exactly one sage.attention, found 0"), sage::ir::ProgramError);
  }
}
