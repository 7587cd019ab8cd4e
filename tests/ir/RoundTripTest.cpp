// Every preset prints, parses back to the identical text, and lowers to the variant it was built from.
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage;

TEST_CASE("every preset round-trips through the textual IR") {
  for (const auto &info : dsl::presets())
    for (int head_dim : {64, 128})
      for (MaskKind mask : {MaskKind::none, MaskKind::causal})
        for (bool lse : {false, true}) {
          const std::string name(info.name);
          CAPTURE(name);
          CAPTURE(head_dim);
          CAPTURE(lse);
          dsl::AttentionBuilder builder = *dsl::preset(info.name, head_dim, mask);
          builder.lse(lse);
          const ir::Program program = builder.build();
          const std::string text = program.print();
          const ir::Program reparsed = ir::Program::parse(text, "roundtrip.mlir");
          CHECK(reparsed.print() == text);
          CHECK(reparsed.fingerprint() == program.fingerprint());
          CHECK(reparsed.variant() == builder.describe());
          CHECK(program.variant() == builder.describe());
          CHECK(text.find("version(1)") != std::string::npos);
        }
}

TEST_CASE("the IR names the algorithm's steps") {
  const std::string text = dsl::preset("sage-b", 128, MaskKind::causal)->lse().build().print();
  for (const char *step : {"sage.smooth %k over sequence", "sage.quantize %q to int8", "sage.mma %q_int8, %k_int8",
                           "sage.dequant %s", "causal", "sage.online_softmax", "exp2 state f32", "sage.accumulate",
                           "sage.normalize", "sage.write_o", "sage.write_lse %p {smoothing_correction}"}) {
    CAPTURE(step);
    CHECK(text.find(step) != std::string::npos);
  }
}

TEST_CASE("different variants have different fingerprints; equal ones equal") {
  auto fingerprint = [](const char *name, int head_dim, MaskKind mask) {
    return dsl::preset(name, head_dim, mask)->build().fingerprint();
  };
  CHECK(fingerprint("sage-b", 128, MaskKind::none) == fingerprint("sage-b", 128, MaskKind::none));
  CHECK(fingerprint("sage-b", 128, MaskKind::none) != fingerprint("sage-t", 128, MaskKind::none));
  CHECK(fingerprint("sage-b", 128, MaskKind::none) != fingerprint("sage-b", 64, MaskKind::none));
  CHECK(fingerprint("sage-b", 128, MaskKind::none) != fingerprint("sage-b", 128, MaskKind::causal));
}

TEST_CASE("hand-written IR with comments and other value names parses to the same program") {
  const std::string text = R"(// SageAttn-B, written by hand
sage.attention @"sage-b" version(1) head_dim(64) block_q(128) block_kv(64) {
  %0 = sage.input q
  %1 = sage.input k
  %2 = sage.input v
  %3 = sage.smooth %1 over sequence  // gamma(K) = K - mean(K)
  %4 = sage.quantize %0 to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}
  %5 = sage.quantize %3 to int8 per_block {group_tokens = 64 : i64}
  %6 = sage.mma %4, %5 -> s32
  %7 = sage.dequant %6
  %8 = sage.online_softmax %7 exp2 state f32
  %9 = sage.quantize %8 to f16 none
  %10 = sage.quantize %2 to f16 none
  %11 = sage.mma %9, %10 -> f16
  %12 = sage.accumulate %11 as f16
  %13 = sage.normalize %12 by %8
  sage.write_o %13
}
)";
  const ir::Program parsed = ir::Program::parse(text, "hand.mlir");
  CHECK(parsed.variant() == dsl::preset("sage-b", 64, MaskKind::none)->describe());
  CHECK(parsed.print() == dsl::preset("sage-b", 64, MaskKind::none)->build().print());
}
