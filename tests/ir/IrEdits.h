// What the IR tests share: the programs they start from (the forward's sage-b, causal, with LSE; the backward's
// sagebwd, K smoothed, causal), the find-and-replace edits that turn a program into each verifier case, and the check
// of the backward's cases. Line numbers matter: each verifier case names the line its error points at.
#pragma once

#include "sage/ir/BackwardProgram.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace sage::ir_test {

inline const std::string kSageBCausalLseProgram =
    R"(sage.attention @t version(1) head_dim(128) block_q(128) block_kv(64) {
  %q = sage.input q
  %k = sage.input k
  %v = sage.input v
  %k_smoothed = sage.smooth %k over sequence
  %q_int8 = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}
  %k_int8 = sage.quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}
  %s = sage.mma %q_int8, %k_int8 -> s32
  %s_dequant = sage.dequant %s
  %s_masked = sage.mask %s_dequant causal
  %p = sage.online_softmax %s_masked exp2 state f32
  %p_f16 = sage.quantize %p to f16 none
  %v_f16 = sage.quantize %v to f16 none
  %pv = sage.mma %p_f16, %v_f16 -> f16
  %o_accumulated = sage.accumulate %pv as f16
  %o = sage.normalize %o_accumulated by %p
  sage.write_o %o
  sage.write_lse %p {smoothing_correction}
}
)";

struct Edit {
  std::string find, replace;
};

struct RuleCase {
  const char *rule;
  std::vector<Edit> edits;
  const char *message; // a substring of the diagnostic
  int line;            // the line the diagnostic points at
};

inline std::string applyEdits(std::string text, const std::vector<Edit> &edits) {
  for (const Edit &edit : edits) {
    size_t at = text.find(edit.find);
    REQUIRE_MESSAGE(at != std::string::npos, "edit target not found: " << edit.find);
    text.replace(at, edit.find.size(), edit.replace);
  }
  return text;
}

inline const std::string kSageBwdCausalProgram =
    R"(sage.attention_backward @b version(1) head_dim(128) block_q(64) block_kv(64) {
  %q = sage.bwd_input q
  %k = sage.bwd_input k
  %v = sage.bwd_input v
  %o = sage.bwd_input o
  %lse = sage.bwd_input lse
  %do = sage.bwd_input do
  %delta = sage.bwd_row_dot %do, %o
  %k_smoothed = sage.bwd_smooth %k over sequence
  %q_int8 = sage.bwd_quantize %q to int8 per_block {group_tokens = 64 : i64}
  %k_int8 = sage.bwd_quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}
  %s = sage.bwd_mma %q_int8, %k_int8 -> s32
  %s_masked = sage.bwd_mask %s causal
  %p = sage.bwd_recompute_p %s_masked, %lse {smoothing_shift}
  %p_int8 = sage.bwd_quantize %p to int8 per_block
  %do_int8 = sage.bwd_quantize %do to int8 per_block {group_tokens = 64 : i64}
  %dv = sage.bwd_mma %p_int8, %do_int8 -> s32
  %do_f16 = sage.bwd_quantize %do to f16 none
  %v_f16 = sage.bwd_quantize %v to f16 none
  %dp = sage.bwd_mma %do_f16, %v_f16 -> f32
  %ds = sage.bwd_ds %p, %dp, %delta
  %ds_int8 = sage.bwd_quantize %ds to int8 per_block
  %dq = sage.bwd_mma %ds_int8, %k_int8 -> s32
  %dk = sage.bwd_mma %ds_int8, %q_int8 -> s32
  sage.bwd_write_grad %dq as f32
  sage.bwd_write_grad %dk as f32
  sage.bwd_write_grad %dv as f32
}
)";

// Parses each rule's edit of `base` as a backward program, which must fail: its first diagnostic holds the rule's
// message (and `also`, when given) and points at the rule's line.
inline void checkBackwardRules(const std::vector<RuleCase> &rules, const std::string &base,
                               const char *also = nullptr) {
  for (const RuleCase &rule : rules) {
    CAPTURE(rule.rule);
    const std::string text = applyEdits(base, rule.edits);
    try {
      (void)ir::BackwardProgram::parse(text, "edited.mlir");
      FAIL("the edited program verified");
    } catch (const ir::ProgramError &error) {
      REQUIRE_FALSE(error.diagnostics().empty());
      const ir::Diagnostic &first = error.diagnostics().front();
      CHECK_MESSAGE(first.message.find(rule.message) != std::string::npos, first.message);
      if (also)
        CHECK_MESSAGE(first.message.find(also) != std::string::npos, first.message);
      CHECK(first.location ==
            "edited.mlir:" + std::to_string(rule.line) + ":" + first.location.substr(first.location.rfind(':') + 1));
    }
  }
}

} // namespace sage::ir_test
