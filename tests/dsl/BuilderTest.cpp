// The fluent DSL: what it builds, the defaults it folds, and the errors it gives.
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage;
using namespace sage::dsl;

TEST_CASE("the issue's example builds SageAttn-B with a causal mask") {
  const AttentionVariant variant =
      attention("example").qk(int8(per_block).smooth_k()).pv(f16(accum::f16)).mask(causal).build().variant();
  CHECK(variant.name == "example");
  CHECK(variant.q.dtype == ElementType::int8);
  CHECK(variant.q.granularity == Granularity::per_block);
  CHECK(variant.q.group_tokens == 128); // the Q tile
  CHECK(variant.k.group_tokens == 64);  // the K tile
  CHECK(variant.q.fold_softmax_scale);
  CHECK(variant.smooth_k == SmoothScope::sequence);
  CHECK(variant.qk.accumulator == AccumulatorType::s32);
  CHECK(variant.pv.accumulator == AccumulatorType::f16);
  CHECK(variant.accumulation.kind == AccumulationKind::f16);
  CHECK(variant.mask.kind == MaskKind::causal);
  CHECK_FALSE(variant.epilogue.write_lse);
}

TEST_CASE("groups and blocks are folded into the quantizers") {
  const AttentionVariant variant =
      attention().blocks(64, 32).qk(int8(per_warp).groups(16, 0)).pv(int8_pv()).build().variant();
  CHECK(variant.block_q == 64);
  CHECK(variant.block_kv == 32);
  CHECK(variant.q.group_tokens == 16);
  CHECK(variant.k.group_tokens == 32);
  CHECK(variant.p.static_scale == doctest::Approx(1.0 / 127.0));
  CHECK(variant.v.granularity == Granularity::per_channel);
  CHECK(variant.accumulation.kind == AccumulationKind::f32);
}

TEST_CASE("LSE output is corrected exactly when K is smoothed") {
  CHECK(attention().qk(int8(per_token).smooth_k()).lse().describe().epilogue.lse_smoothing_correction);
  CHECK_FALSE(attention().qk(int8(per_token)).lse().describe().epilogue.lse_smoothing_correction);
  CHECK_FALSE(attention().qk(int8(per_token).smooth_k()).describe().epilogue.write_lse);
}

TEST_CASE("two-level accumulations carry their flush period") {
  const AttentionVariant f16_two_level = attention().pv(f16(accum::f16_then_f32).flush_every(8)).build().variant();
  CHECK(f16_two_level.accumulation.kind == AccumulationKind::f16_then_f32);
  CHECK(f16_two_level.accumulation.flush_period == 8);
  const AttentionVariant fp8 = preset("sage2-fp8")->build().variant();
  CHECK(fp8.pv.a == ElementType::e4m3);
  CHECK(fp8.accumulation.kind == AccumulationKind::f32_two_level);
  CHECK(fp8.accumulation.flush_period > 0);
}

TEST_CASE("bad arguments name the argument") {
  CHECK_THROWS_WITH_AS(attention().head_dim(100), doctest::Contains("head_dim"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(attention().blocks(0, 64), doctest::Contains("block_q=0"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(int8(Granularity::per_channel), doctest::Contains("qk granularity"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(f16(accum::f16_then_f32).flush_every(0), doctest::Contains("flush_every"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(fp8_e4m3(accum::f16), doctest::Contains("fp8_e4m3 accumulation"), std::invalid_argument);
}

TEST_CASE("what the DSL lets through, the verifier still checks") {
  CHECK_THROWS_WITH_AS(attention().qk(int8(per_thread).groups(12, 64)).build(),
                       doctest::Contains("per_thread interleaves tokens by 8"), ir::ProgramError);
  CHECK_THROWS_WITH_AS(attention().pv(f16(accum::f16_then_f32)).build(),
                       doctest::Contains("f16_then_f32 needs flush_period in [1, 1048576]"), ir::ProgramError);
}

TEST_CASE("the preset table") {
  std::string names;
  for (const PresetInfo &info : presets())
    names += std::string(info.name) + " ";
  CHECK(names == "sage-t sage-b sage-vt sage-vb sage2-fp8 exact ");
  CHECK_FALSE(preset("sage-x").has_value());
  CHECK(preset("sage-t", 64, MaskKind::causal)->describe().head_dim == 64);
  CHECK(preset("sage-t")->describe().q.granularity == Granularity::per_token);
  CHECK(preset("sage-vb")->describe().pv.accumulator == AccumulatorType::s32);
  CHECK(preset("exact")->describe().q.dtype == ElementType::f32);
}

TEST_CASE("the reference-only presets: SageAttention3 FP4 and SageAttention2 INT4 with their ablations") {
  std::string names;
  for (const PresetInfo &info : referenceOnlyPresets())
    names += std::string(info.name) + " ";
  CHECK(names == "sage3-fp4 sage3-fp4-direct-p sage3-mxfp4 sage2-int4 sage2-int4-no-smooth-q sagebwd ");

  const AttentionVariant fp4 = preset("sage3-fp4")->describe();
  for (const QuantizerSpec *spec : {&fp4.q, &fp4.k, &fp4.p, &fp4.v}) {
    CHECK(spec->dtype == ElementType::e2m1);
    CHECK(spec->granularity == Granularity::microscale_1x16);
    CHECK(spec->scale_type == ScaleType::ue4m3);
  }
  CHECK(fp4.p.two_level);
  CHECK(fp4.q.fold_softmax_scale);
  CHECK(fp4.smooth_q == SmoothScope::block);
  CHECK(fp4.smooth_k == SmoothScope::sequence);
  CHECK(fp4.qk == MatmulSpec{ElementType::e2m1, ElementType::e2m1, AccumulatorType::f32});
  CHECK_FALSE(preset("sage3-fp4-direct-p")->describe().p.two_level);

  const AttentionVariant mx = preset("sage3-mxfp4")->describe();
  CHECK(mx.v.granularity == Granularity::microscale_1x32);
  CHECK(mx.v.scale_type == ScaleType::ue8m0);
  CHECK_FALSE(mx.p.two_level);

  const AttentionVariant int4_variant = preset("sage2-int4")->describe();
  CHECK(int4_variant.q.dtype == ElementType::int4);
  CHECK(int4_variant.q.granularity == Granularity::per_thread);
  CHECK(int4_variant.q.group_tokens == 32);
  CHECK(int4_variant.k.group_tokens == 64);
  CHECK(int4_variant.smooth_q == SmoothScope::block);
  CHECK(int4_variant.qk.accumulator == AccumulatorType::s32);
  CHECK(preset("sage2-int4-no-smooth-q")->describe().smooth_q == SmoothScope::none);
  // Built programs verify (the IR's own checks, not only the struct).
  for (const PresetInfo &info : referenceOnlyPresets())
    CHECK_NOTHROW(preset(info.name, 64, MaskKind::causal)->lse().build());
}

TEST_CASE("the rotated presets are their base presets with Q and K rotated by the same seed") {
  for (const auto &[rotated, base] : {std::pair{"sage-b-rot", "sage-b"}, std::pair{"sage2-fp8-rot", "sage2-fp8"}}) {
    CAPTURE(rotated);
    const AttentionVariant variant = preset(rotated)->describe();
    AttentionVariant expected = preset(base)->describe();
    CHECK(variant.q.rotation_seed.has_value());
    CHECK(variant.q.rotation_seed == variant.k.rotation_seed);
    expected.q.rotation_seed = variant.q.rotation_seed;
    expected.k.rotation_seed = variant.k.rotation_seed;
    expected.name = variant.name;
    CHECK(variant == expected);
    CHECK_NOTHROW(preset(rotated, 64, MaskKind::causal)->lse().build());
  }
}

TEST_CASE("sagebwd's forward (Algorithm 2): per-block int8 Q/K/V, per-token int8 P, the LSE saved") {
  const AttentionVariant forward = preset("sagebwd")->describe();
  CHECK(forward.q.granularity == Granularity::per_block);
  CHECK(forward.k.granularity == Granularity::per_block);
  CHECK(forward.smooth_k == SmoothScope::sequence);
  CHECK(forward.p == QuantizerSpec{ElementType::int8, Granularity::per_token});
  CHECK(forward.v.dtype == ElementType::int8);
  CHECK(forward.v.granularity == Granularity::per_block);
  CHECK(forward.v.group_tokens == forward.block_kv); // one scale per KV tile factors out of the tile's P.V
  CHECK(forward.pv.accumulator == AccumulatorType::s32);
  CHECK(forward.epilogue.write_lse);
  CHECK(forward.epilogue.lse_smoothing_correction);
  // A V scale per part of a KV tile does not factor out: the verifier refuses it.
  AttentionVariant half_tile = forward;
  half_tile.v.group_tokens = forward.block_kv / 2;
  CHECK_THROWS_WITH_AS(emitProgram(half_tile), doctest::Contains("per_block with one scale per KV tile"),
                       sage::ir::ProgramError);
}
