// Regression tests for hostile IR (issue 10): inputs that crashed, hung or were silently accepted must now be
// refused with a message that names the attribute or position and what was expected.
#include "IrEdits.h"
#include "sage/dsl/Attention.h"
#include "sage/dsl/AttentionBackward.h"
#include "sage/dsl/Presets.h"
#include "sage/ir/BackwardProgram.h"
#include "sage/ir/Legalize.h"
#include "sage/ir/Program.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using namespace sage::ir_test;
const std::string &kValidProgram = kSageBCausalLseProgram;

std::string edited(const std::string &find, const std::string &replace) {
  return applyEdits(kValidProgram, {{find, replace}});
}

// Parsing must fail (not crash, not hang) with a diagnostic containing `expected`.
void checkRefused(const std::string &text, const std::string &expected) {
  CAPTURE(expected);
  try {
    sage::ir::Program::parse(text, "hostile.mlir");
    FAIL_CHECK("accepted: " << text.substr(0, 400));
  } catch (const sage::ir::ProgramError &error) {
    CHECK_MESSAGE(std::string(error.what()).find(expected) != std::string::npos, std::string(error.what()));
  }
}

} // namespace

TEST_CASE("the base program is valid") { CHECK_NOTHROW(sage::ir::Program::parse(kValidProgram, "base.mlir")); }

TEST_CASE("a value used in its own definition is an error, not endless recursion") {
  checkRefused(edited("%q_int8 = sage.quantize %q to", "%q_int8 = sage.quantize %q_int8 to"),
               "operand #0 is used before (or in) its definition");
}

TEST_CASE("cycles through sage.dequant and sage.mask end") {
  // %s_dequant and %x feed each other: a dataflow walk that follows producers would loop forever.
  checkRefused(
      edited("  %s_dequant = sage.dequant %s\n", "  %s_dequant = sage.dequant %x\n  %x = sage.dequant %s_dequant\n"),
      "%x is used before its definition");
  checkRefused(edited("  %s_dequant = sage.dequant %s\n",
                      "  %s_dequant = sage.dequant %s\n  %m1 = sage.mask %m2 causal\n  %m2 = sage.mask %m1 causal\n"),
               "%m2 is used before its definition");
}

TEST_CASE("a use before the definition is reported, and the error path leaves nothing dangling") {
  // The 3-line shape from the issue: the parser's forward reference is never resolved inside the region.
  checkRefused("sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) {\n  %a = sage.dequant %b\n}\n",
               "hostile.mlir:2:");
  checkRefused(edited("  %s = sage.mma %q_int8, %k_int8 -> s32\n", "  %s = sage.mma %q_int8, %k_late -> s32\n"),
               "hostile.mlir:8:");
  // Defined later in the same block: MLIR would report dominance, the trait reports it first by position.
  std::string late = edited("  %k_int8 = sage.quantize %k_smoothed to", "  %k_int8 = sage.quantize %late to");
  late.insert(late.find("  sage.write_o"), "  %late = sage.smooth %k over sequence\n");
  checkRefused(late, "hostile.mlir:7:27: error: %late is used before its definition (at hostile.mlir:17:3)");
}

// Issue 26: MLIR resolves a forward reference wherever the definition turns up, also inside the region of an op still
// being parsed; a parse error then destroys that region while the user, already in the module, still points into it
// (valgrind: an invalid write in Operation::dropAllReferences; repeated parses killed the process). Such text is
// refused before MLIR parses it. tools/ir-memcheck runs these shapes (fuzz/regressions/*/forward-reference-*) under
// valgrind.
TEST_CASE("forward references into a region are refused before MLIR builds anything") {
  const std::string region = "sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) {\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      // the issue's 3-line shape: a top-level use, the definition inside a later region, then a parse error
      {"%a = sage.dequant %b\n" + region + "  %b = sage.input q\n  garbage\n",
       "hostile.mlir:1:19: error: %b is used before its definition (at hostile.mlir:3:3)"},
      // the same in MLIR's generic syntax, and with a block argument as the definition
      {"%a = \"sage.dequant\"(%b) : (!sage.tile) -> !sage.tile\n\"sage.attention\"() ({\n  %b = \"sage.input\"() "
       "{role = #sage<role q>} : () -> !sage.tile\n  garbage\n})\n",
       "%b is used before its definition"},
      {"%a = \"sage.dequant\"(%b) : (!sage.tile) -> !sage.tile\n\"sage.attention\"() ({\n^bb0(%b: !sage.tile):\n  "
       "garbage\n})\n",
       "%b is used before its definition (at hostile.mlir:3:6)"},
      // a use after a closed region's definition is a placeholder again, which a later definition would resolve
      {region + "  %b = sage.input q\n}\n%a = sage.dequant %b\n" + region + "  %b = sage.input k\n  garbage\n",
       "hostile.mlir:6:3: error: %b is defined a second time (first at hostile.mlir:2:3)"},
      // MLIR's lexer ends a comment at a carriage return too: the definition after it is seen
      {"%a = sage.dequant %b // comment\r" + region + "  %b = sage.input q\n  garbage\n",
       "%b is used before its definition"},
      // result lists: `%b:1` and `%c, %b =` define %b as well
      {"%a = sage.dequant %b\n" + region + "  %b:1 = sage.input q\n  garbage\n", "%b is used before its definition"},
      {"%a = sage.dequant %b\n" + region + "  %c, %b = sage.input q\n  garbage\n", "%b is used before its definition"},
  };
  for (int round = 0; round < 50; ++round) // repeated parses used to abort the process
    for (const auto &[text, expected] : cases)
      checkRefused(text, expected);
  // The backward program's parser shares the check.
  const std::string backward = "%d = sage.bwd_row_dot %do, %o\nsage.attention_backward @b version(1) head_dim(64) "
                               "block_q(64) block_kv(64) {\n  %do = sage.bwd_input do\n  %o = sage.bwd_input o\n  "
                               "garbage\n";
  try {
    sage::ir::BackwardProgram::parse(backward, "backward.mlir");
    FAIL_CHECK("accepted");
  } catch (const sage::ir::ProgramError &error) {
    CHECK(std::string(error.what()).find("backward.mlir:1:23: error: %do is used before its definition") !=
          std::string::npos);
  }
  // Names inside strings and comments are no definitions or uses; a self-use stays the verifier's to report.
  CHECK_NOTHROW(sage::ir::Program::parse("// %z\n" + kValidProgram + "// %q = x, %k\n", "comments.mlir"));
  checkRefused(edited("%q_int8 = sage.quantize %q to", "%q_int8 = sage.quantize %q_int8 to"),
               "operand #0 is used before (or in) its definition");
}

TEST_CASE("deeply nested brackets are refused before MLIR's recursive parser sees them") {
  for (char open : {'[', '(', '{', '<'}) {
    std::string text = "sage.attention @t version(1) head_dim(64) block_q(64) block_kv(64) attributes {x = " +
                       std::string(5000, open) + "}";
    checkRefused(text, "nest deeper than 32 levels");
  }
  // Brackets inside strings and comments do not count.
  std::string commented = "// " + std::string(100, '[') + "\n" + kValidProgram;
  CHECK_NOTHROW(sage::ir::Program::parse(commented, "comment.mlir"));
}

TEST_CASE("an oversized program is refused by size") {
  checkRefused(kValidProgram + "//" + std::string(sage::ir::kMaxProgramBytes, 'x') + "\n", "at most 1048576 bytes");
}

TEST_CASE("integer attributes are range-checked as signed 64-bit values") {
  checkRefused(edited("block_kv(64)", "block_kv(-64)"),
               "block_kv must be a positive multiple of 16 up to 1024, got -64");
  checkRefused(edited("block_kv(64)", "block_kv(4294967296)"), "got 4294967296");
  checkRefused(edited("block_q(128)", "block_q(4294967424)"), "block_q must be a positive multiple of 16 up to 1024");
  checkRefused(edited("head_dim(128)", "head_dim(-128)"), "head_dim must be a positive multiple of 16 up to 256");
  checkRefused(edited("group_tokens = 64 : i64", "group_tokens = -64 : i64"), "group_tokens in [1, 1024]");
  checkRefused(edited("group_tokens = 64 : i64", "group_tokens = 4294967360 : i64"), "group_tokens in [1, 1024]");
  checkRefused(edited("sage.accumulate %pv as f16", "sage.accumulate %pv as f16_then_f32 {flush_period = -1 : i64}"),
               "flush_period in [1, 1048576]");
  checkRefused(edited("sage.accumulate %pv as f16",
                      "sage.accumulate %pv as f16_then_f32 {flush_period = 9223372036854775807 : i64}"),
               "flush_period in [1, 1048576]");
}

TEST_CASE("a static scale must stay a finite, normal f32 with a finite reciprocal") {
  for (const char *scale : {"1.0e+300", "1.0e-300", "0.0", "-1.0"})
    checkRefused(edited("%p to f16 none", std::string("%p to int8 per_tensor {static_scale = ") + scale + " : f64}"),
                 "static_scale must lie in [2^-64, 2^64]");
}

TEST_CASE("unknown or misspelled attributes are errors naming the attribute and the known ones") {
  checkRefused(edited("{group_tokens = 64 : i64}", "{group_tokns = 64 : i64}"), "unknown attribute 'group_tokns'");
  checkRefused(edited("sage.accumulate %pv as f16", "sage.accumulate %pv as f16 {flush = 2 : i64}"),
               "unknown attribute 'flush'; expected flush_period");
  checkRefused(edited("block_kv(64) {", "block_kv(64) attributes {blok_kv = 3 : i64} {"),
               "unknown attribute 'blok_kv'");
  checkRefused(edited("sage.write_o %o", "sage.write_o %o {smoothing_correction}"), "unknown attribute");
}

TEST_CASE("a NUL byte is refused at its position; text without a terminating NUL parses") {
  // Found by fuzz_ir: an embedded NUL made MLIR's lexer read past the end of the buffer.
  std::string text = kValidProgram;
  text.insert(text.find(" to int8 per_block"), 1, '\0');
  checkRefused(text, "hostile.mlir:6:29: error: a NUL byte");
  // A view into a larger buffer, not NUL-terminated after the program.
  const std::string padded = kValidProgram + "garbage";
  CHECK_NOTHROW(sage::ir::Program::parse(std::string_view(padded.data(), kValidProgram.size()), "view.mlir"));
}

namespace {

// `text` with `entry` added to the attribute dictionary of the first line containing `line_part` (a new dictionary if
// it has none; `attributes {...}` before the body of a program).
std::string withDictionaryEntry(const std::string &text, const std::string &line_part, const std::string &entry) {
  const size_t at = text.find(line_part);
  REQUIRE_MESSAGE(at != std::string::npos, "line not found: " << line_part);
  const size_t line_end = text.find('\n', at);
  std::string line = text.substr(at, line_end - at);
  if (line.back() == '{' && line.find("sage.attention") != std::string::npos)
    line.insert(line.size() - 1, "attributes {" + entry + "} ");
  else if (line.back() == '}')
    line.insert(line.rfind('{') + 1, entry + ", ");
  else
    line += " {" + entry + "}";
  return text.substr(0, at) + line + text.substr(line_end);
}

template <typename ProgramType>
void checkRestatementRefused(const std::string &text, const std::string &line_part, const std::string &op,
                             const std::string &entry) {
  const std::string attribute = entry.substr(0, entry.find(' '));
  CAPTURE(op);
  CAPTURE(entry);
  try {
    ProgramType::parse(withDictionaryEntry(text, line_part, entry), "dict.mlir");
    FAIL_CHECK("accepted");
  } catch (const sage::ir::ProgramError &error) {
    const std::string expected =
        "custom op '" + op + "' sets '" + attribute + "' in its attribute dictionary, which its syntax already gives";
    CHECK_MESSAGE(std::string(error.what()).find(expected) != std::string::npos, error.what());
  }
}

} // namespace

// Issue 26: with properties, an inherent attribute in the dictionary replaced what the op's syntax said, so
// `sage.mask %s causal {kind = #sage<mask_kind none>}` ran without a mask and `explain` said none.
TEST_CASE("an attribute dictionary cannot restate what an op's syntax says, in any op") {
  using sage::ir::BackwardProgram;
  using sage::ir::Program;
  const std::string forward = sage::dsl::preset("sage-b", 128, sage::MaskKind::causal)->lse().build().print();
  // The issue's three examples: the mask's kind, a quantizer's granularity, SLA's feature map.
  checkRestatementRefused<Program>(forward, "sage.mask", "sage.mask", "kind = #sage<mask_kind none>");
  checkRestatementRefused<Program>(forward, "%k_int8 = sage.quantize", "sage.quantize",
                                   "granularity = #sage<granularity per_token>");
  const std::string sla = sage::dsl::preset("sla-f16", 128)->build().print();
  checkRestatementRefused<Program>(sla, "sage.linear_branch", "sage.linear_branch",
                                   "feature_map = #sage<feature_map relu>");
  // Every other attribute an op's syntax gives; restating the same value is refused as well.
  const std::vector<std::tuple<std::string, std::string, std::string>> forward_cases = {
      {"sage.attention", "sage.attention", "head_dim = 64 : i64"},
      {"sage.attention", "sage.attention", "block_q = 128 : i64"},
      {"sage.attention", "sage.attention", "block_kv = 64 : i64"},
      {"sage.attention", "sage.attention", "version = 1 : i64"},
      {"sage.attention", "sage.attention", "sym_name = \"other\""},
      {"sage.input q", "sage.input", "role = #sage<role k>"},
      {"sage.smooth", "sage.smooth", "scope = #sage<smooth_scope block>"},
      {"%k_int8 = sage.quantize", "sage.quantize", "dtype = #sage<element_type f16>"},
      {"%s = sage.mma", "sage.mma", "accumulator = #sage<accumulator s32>"},
      {"sage.mask", "sage.mask", "kind = #sage<mask_kind causal>"},
      {"sage.online_softmax", "sage.online_softmax", "base = #sage<softmax_base exp>"},
      {"sage.online_softmax", "sage.online_softmax", "state = #sage<element_type f16>"},
      {"sage.accumulate", "sage.accumulate", "kind = #sage<accumulation f32>"},
  };
  for (const auto &[line, op, entry] : forward_cases)
    checkRestatementRefused<Program>(forward, line, op, entry);
  checkRestatementRefused<Program>(sla, "sage.predict_mask", "sage.predict_mask", "critical_percent = 50.0 : f64");
  checkRestatementRefused<Program>(sla, "sage.predict_mask", "sage.predict_mask", "negligible_percent = 0.0 : f64");
  const std::string legalized =
      sage::ir::legalizeForTarget(sage::dsl::preset("sage3-fp4", 128)->build(), "sm_90a").print();
  checkRestatementRefused<Program>(legalized, "sage.decode", "sage.decode", "dtype = #sage<element_type bf16>");
  const std::string backward = sage::dsl::backwardPreset("sagebwd", 128, sage::MaskKind::causal)->build().print();
  const std::vector<std::tuple<std::string, std::string, std::string>> backward_cases = {
      {"sage.attention_backward", "sage.attention_backward", "head_dim = 64 : i64"},
      {"sage.bwd_input q", "sage.bwd_input", "role = #sage<backward_role k>"},
      {"%q_int8 = sage.bwd_quantize", "sage.bwd_quantize", "granularity = #sage<granularity per_token>"},
      {"%q_int8 = sage.bwd_quantize", "sage.bwd_quantize", "dtype = #sage<element_type int8>"},
      {"%s = sage.bwd_mma", "sage.bwd_mma", "accumulator = #sage<accumulator f32>"},
      {"sage.bwd_mask", "sage.bwd_mask", "kind = #sage<mask_kind none>"},
      {"sage.bwd_write_grad %dq", "sage.bwd_write_grad", "accumulation = #sage<accumulation f16>"},
  };
  for (const auto &[line, op, entry] : backward_cases)
    checkRestatementRefused<BackwardProgram>(backward, line, op, entry);

  // What the printer itself writes into dictionaries stays accepted, and so does an optional attribute added there.
  CHECK_NOTHROW(Program::parse(forward, "forward.mlir"));
  CHECK_NOTHROW(BackwardProgram::parse(backward, "backward.mlir"));
  const Program with_group = Program::parse(
      withDictionaryEntry(forward, "%v_f16 = sage.quantize", "scale_type = #sage<scale_type f32>"), "scale.mlir");
  CHECK(with_group.variant() == Program::parse(forward, "forward.mlir").variant());
  // MLIR's generic syntax could give an attribute twice, as a property and in the dictionary: refused.
  std::string generic = forward;
  const std::string mask_line = "sage.mask %s_dequant causal";
  generic.replace(generic.find(mask_line), mask_line.size(),
                  "\"sage.mask\"(%s_dequant) <{kind = #sage<mask_kind causal>}> {kind = #sage<mask_kind none>} : "
                  "(!sage.tile) -> !sage.tile");
  checkRefused(generic, "properties '<{...}>' (MLIR's generic syntax)");
}

// Issue 26: a program's name becomes part of kernel names and of the generated source's comments; `@"x\0A#error ..."`
// passed `check` and put a line of its own before NVRTC. Names are letters, digits, '_', '.' and '-' (codegen escapes
// anything else in variants built without the IR: tests/codegen/SourceTextTest.cpp).
TEST_CASE("program names are letters, digits, '_', '.' and '-', forward and backward") {
  for (const char *bad :
       {"x\\0A#error injected", "x\\0D#error", "x\\00y", "x\\5C\\0Ay", "x */ y", "x\\E2\\80\\A8y", "a b", ""})
    checkRefused(edited("@t ", std::string("@\"") + bad + "\" "), "a program's name is 1 to 64 letters, digits");
  checkRefused(edited("@t ", "@\"x\\0A#error injected\" "), "hostile.mlir:1:1: error: 'sage.attention' op name "
                                                            "\"x\\0A#error injected\" (17 bytes)");
  checkRefused(edited("@t ", "@" + std::string(65, 'n') + " "), "(65 bytes)");
  CHECK_NOTHROW(sage::ir::Program::parse(edited("@t ", "@" + std::string(64, 'n') + " "), "long.mlir"));
  CHECK_NOTHROW(sage::ir::Program::parse(edited("@t ", "@\"Sage_2.b-c\" "), "name.mlir"));
  CHECK_THROWS_WITH_AS(sage::dsl::attention("x\n#define kHeadDim 1").build(),
                       doctest::Contains("a program's name is 1 to 64"), sage::ir::ProgramError);
  CHECK_THROWS_WITH_AS(sage::dsl::attention_backward("x\n#error").build(),
                       doctest::Contains("a program's name is 1 to 64"), sage::ir::ProgramError);
  const std::string backward = sage::dsl::backwardPreset("sagebwd", 64)->build().print();
  std::string renamed = backward;
  renamed.replace(renamed.find("@sagebwd"), 8, "@\"sagebwd\\0A#error x\"");
  CHECK_THROWS_WITH_AS(sage::ir::BackwardProgram::parse(renamed, "backward.mlir"),
                       doctest::Contains("'sage.attention_backward' op name \"sagebwd\\0A#error x\""),
                       sage::ir::ProgramError);
}

namespace {

// A valid program with `k_ops` before K's quantizer (which quantizes `k_input`) and `score_ops` between the scores'
// dequantization (%d) and the softmax (which reads `softmax_input`).
std::string programWith(const std::string &k_ops, const std::string &k_input, const std::string &score_ops,
                        const std::string &softmax_input) {
  return "sage.attention @t version(1) head_dim(128) block_q(128) block_kv(64) {\n"
         "  %q = sage.input q\n  %k = sage.input k\n  %v = sage.input v\n  %ks = sage.smooth %k over sequence\n"
         "  %qi = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}\n" +
         k_ops + "  %ki = sage.quantize " + k_input + " to int8 per_block {group_tokens = 64 : i64}\n" +
         "  %s = sage.mma %qi, %ki -> s32\n  %d = sage.dequant %s\n" + score_ops + "  %p = sage.online_softmax " +
         softmax_input +
         " exp2 state f32\n  %pf = sage.quantize %p to f16 none\n  %vf = sage.quantize %v to f16 none\n"
         "  %pv = sage.mma %pf, %vf -> f16\n  %oa = sage.accumulate %pv as f16\n  %o = sage.normalize %oa by %p\n"
         "  sage.write_o %o\n}\n";
}

// The fastest of five parses (accepted or refused: verifying is the cost either way), in seconds.
double parseSeconds(const std::string &text) {
  double best = 1e9;
  for (int run = 0; run < 5; ++run) {
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)sage::ir::Program::parse(text, "long.mlir");
    } catch (const sage::ir::ProgramError &) {
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

} // namespace

// Issue 26: every op's verifier walked its producers to the chain's start, so 26,000 chained ops (1 MB) took 10 s to
// verify, in `check` and in sage_attention_create alike. Walks are bounded now (Dataflow.h): 10x the ops must cost
// about 10x the time, far from the 100x of a quadratic verifier. Measured against the same shape's short program, so
// the machine's speed and load cancel out.
TEST_CASE("verifying is linear in the number of ops, whatever their shape") {
  const auto chain = [](const char *format_first, const char *format_next, int count) {
    std::string ops;
    for (int i = 0; i < count; ++i) {
      char line[96];
      std::snprintf(line, sizeof line, i == 0 ? format_first : format_next, i, i - 1);
      ops += line;
    }
    return ops;
  };
  struct Shape {
    std::string name;
    std::function<std::string(int)> text;
  };
  const std::vector<Shape> shapes = {
      {"chained casts of K (the issue's shape)",
       [&](int n) {
         return programWith(
             chain("  %%c%d = sage.quantize %%ks to f16 none\n", "  %%c%d = sage.quantize %%c%d to f16 none\n", n),
             "%c" + std::to_string(n - 1), "", "%d");
       }},
      {"chained masks",
       [&](int n) {
         return programWith("", "%ks", chain("  %%m%d = sage.mask %%d none\n", "  %%m%d = sage.mask %%m%d none\n", n),
                            "%m" + std::to_string(n - 1));
       }},
      {"quantizers of K side by side",
       [&](int n) {
         return programWith(
             chain("  %%c%d = sage.quantize %%ks to f16 none\n", "  %%c%d = sage.quantize %%ks to f16 none\n", n),
             "%ks", "", "%d");
       }},
      {"masks side by side",
       [&](int n) {
         return programWith("", "%ks", chain("  %%m%d = sage.mask %%d none\n", "  %%m%d = sage.mask %%d none\n", n),
                            "%m0");
       }},
  };
  constexpr int kShort = 2'000, kLong = 20'000;
  for (const Shape &shape : shapes) {
    CAPTURE(shape.name);
    const std::string long_text = shape.text(kLong);
    REQUIRE(long_text.size() <= sage::ir::kMaxProgramBytes);
    const double short_seconds = std::max(parseSeconds(shape.text(kShort)), 1e-3);
    const double long_seconds = parseSeconds(long_text);
    CAPTURE(short_seconds);
    CAPTURE(long_seconds);
    CHECK(long_seconds < 30 * short_seconds);
  }
  // The masks in a row are refused at the second, the casts of casts at the second cast.
  checkRefused(shapes[0].text(3), "op quantizes the result of 'sage.quantize': Q, K, V and P are quantized once");
  checkRefused(shapes[1].text(3), "masks scores a sage.mask already masked: a program has at most one sage.mask");
  checkRefused(shapes[2].text(3), "hostile.mlir:7:9: error: 'sage.quantize' op computes a value nothing uses");
  checkRefused(shapes[3].text(3), "expects at most one sage.mask");
}
