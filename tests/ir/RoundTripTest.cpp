// Every preset prints, parses back to the identical text, and lowers to the variant it was built from.
#include "sage/dsl/Presets.h"
#include "sage/ir/Program.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace sage;

TEST_CASE("every preset round-trips through the textual IR") {
  std::vector<dsl::PresetInfo> all = dsl::presets();
  all.insert(all.end(), dsl::referenceOnlyPresets().begin(), dsl::referenceOnlyPresets().end());
  for (const auto &info : all)
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

TEST_CASE("the FP4 and INT4 presets say what they are in the IR") {
  const std::string fp4 = dsl::preset("sage3-fp4", 128, MaskKind::none)->build().print();
  for (const char *step : {"sage.smooth %q over block", "sage.quantize %q_smoothed to e2m1 microscale_1x16",
                           "scale_type = #sage<scale_type ue4m3>", "sage.mma %q_e2m1, %k_e2m1 -> f32",
                           "sage.q_mean_correction %s_dequant, mean(%q_smoothed), %k_smoothed",
                           "%v to e2m1 microscale_1x16", "two_level"}) {
    CAPTURE(step);
    CHECK(fp4.find(step) != std::string::npos);
  }
  CHECK(dsl::preset("sage3-fp4-direct-p", 128)->build().print().find("two_level") == std::string::npos);
  const std::string mx = dsl::preset("sage3-mxfp4", 128)->build().print();
  CHECK(mx.find("microscale_1x32") != std::string::npos);
  CHECK(mx.find("ue8m0") != std::string::npos);
  const std::string int4 = dsl::preset("sage2-int4", 128)->build().print();
  CHECK(int4.find("to int4 per_thread") != std::string::npos);
  CHECK(int4.find("sage.q_mean_correction") != std::string::npos);
  CHECK(dsl::preset("sage2-int4-no-smooth-q", 128)->build().print().find("q_mean_correction") == std::string::npos);
}

TEST_CASE("a rotated variant round-trips and says so in the IR") {
  for (uint32_t seed : {0u, 12345u, 4294967295u}) {
    CAPTURE(seed);
    dsl::AttentionBuilder builder = dsl::attention("rot").qk(dsl::int8(dsl::per_block).smooth_k().rotate(seed));
    builder.pv(dsl::f16(dsl::accum::f16));
    const ir::Program program = builder.build();
    const std::string text = program.print();
    CHECK(text.find("rotation_seed = " + std::to_string(seed) + " : i64") != std::string::npos);
    const ir::Program reparsed = ir::Program::parse(text, "rot.mlir");
    CHECK(reparsed.print() == text);
    CHECK(reparsed.variant() == builder.describe());
    CHECK(reparsed.variant().q.rotation_seed == seed);
    CHECK(reparsed.variant().k.rotation_seed == seed);
  }
  // The seed is part of the program, hence of every cache key.
  auto fingerprint = [](uint32_t seed) {
    return dsl::attention("rot").qk(dsl::int8(dsl::per_block).smooth_k().rotate(seed)).build().fingerprint();
  };
  CHECK(fingerprint(1) != fingerprint(2));
  CHECK(fingerprint(1) != dsl::attention("rot").qk(dsl::int8(dsl::per_block).smooth_k()).build().fingerprint());
}

TEST_CASE("the builder refuses a rotation the verifier refuses, with its reason") {
  CHECK_THROWS_WITH_AS(dsl::attention("rot").head_dim(96).qk(dsl::int8(dsl::per_block).rotate()).build(),
                       doctest::Contains("head_dim must be a power of two"), ir::ProgramError);
}
