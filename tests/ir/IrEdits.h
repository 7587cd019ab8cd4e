// What the IR tests share: the sage-b program the forward tests start from (causal, with LSE) and the find-and-replace
// edits that turn a program into each case (BackwardIrEdits.h has the backward's program). Line numbers matter: each
// verifier case names the line its error points at.
#pragma once

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

} // namespace sage::ir_test
