// sage::schedules::WorkspaceLayout: scale groups and the workspace's sizes, offsets and alignment, against
// values computed by hand in the comments.
#include "sage/schedules/WorkspaceLayout.h"
#include "PrologueTestVariants.h"
#include "sage/dsl/Presets.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::schedules;
using prologue_test::VariantKind;
using prologue_test::VKind;

namespace {

QuantizerSpec spec(Granularity granularity, int group_tokens = 0) {
  return prologue_test::tokenQuantizer(ElementType::int8, granularity, group_tokens);
}

// b = 2, h_q = 4, h_kv = 2 (GQA), 300 Q tokens, 333 KV tokens, d = 64.
ProblemShape smallShape() {
  ProblemShape shape;
  shape.batch = 2;
  shape.heads_q = 4;
  shape.heads_kv = 2;
  shape.tokens_q = 300;
  shape.tokens_kv = 333;
  shape.head_dim = 64;
  return shape;
}

AttentionVariant variantOf(Granularity granularity, int q_group, int k_group, bool smooth_q, bool smooth_k,
                           bool smooth_v, VKind v) {
  return prologue_test::makeVariant(
      VariantKind{"layout", ElementType::int8, granularity, q_group, k_group, smooth_q, smooth_k, smooth_v, v}, 64);
}

std::vector<BufferSlice> slicesOf(const WorkspaceLayout &layout) {
  return {layout.q_codes,
          layout.q_scales,
          layout.k_codes,
          layout.k_scales,
          layout.k_mean,
          layout.q_mean,
          layout.v_values,
          layout.v_codes,
          layout.v_scales,
          layout.v_mean,
          layout.delta_s,
          layout.prologue_statistics,
          layout.prologue_counters,
          layout.attention_counters};
}

// Every buffer 256-byte aligned, inside total_bytes, and no two used buffers overlap.
void checkAlignedAndDisjoint(const WorkspaceLayout &layout) {
  std::vector<BufferSlice> used;
  for (const BufferSlice &slice : slicesOf(layout)) {
    CHECK(slice.offset % 256 == 0);
    CHECK(slice.offset + slice.bytes <= layout.total_bytes);
    if (slice.bytes > 0)
      used.push_back(slice);
  }
  std::sort(used.begin(), used.end(), [](const BufferSlice &a, const BufferSlice &b) { return a.offset < b.offset; });
  for (size_t i = 1; i < used.size(); ++i)
    CHECK(used[i - 1].offset + used[i - 1].bytes <= used[i].offset);
  CHECK(layout.total_bytes % 256 == 0);
}

} // namespace

TEST_CASE("groupsPerBlock: scales per quantization block for each granularity") {
  CHECK(groupsPerBlock(spec(Granularity::none), 128) == 0);
  CHECK(groupsPerBlock(spec(Granularity::per_tensor), 128) == 1);
  CHECK(groupsPerBlock(spec(Granularity::per_token), 64) == 64);
  CHECK(groupsPerBlock(spec(Granularity::per_block, 128), 128) == 1);
  CHECK(groupsPerBlock(spec(Granularity::per_block, 0), 64) == 1); // 0: the whole tile
  CHECK(groupsPerBlock(spec(Granularity::per_warp, 32), 128) == 4);
  CHECK(groupsPerBlock(spec(Granularity::per_thread, 32), 128) == 32); // 4 groups x 8 interleaved rows
  CHECK(groupsPerBlock(spec(Granularity::per_thread, 64), 64) == 8);
  CHECK_THROWS_AS(groupsPerBlock(spec(Granularity::per_block, 48), 128), std::invalid_argument); // 48 !| 128
  CHECK_THROWS_AS(groupsPerBlock(spec(Granularity::per_thread, 4), 128), std::invalid_argument); // 4 % 8 != 0
  CHECK_THROWS_AS(groupsPerBlock(spec(Granularity::per_channel), 128), std::invalid_argument);
  CHECK_THROWS_AS(groupsPerBlock(spec(Granularity::per_token), 0), std::invalid_argument);
}

TEST_CASE("scaleGroupOfToken: the scale of a token within the sequence") {
  CHECK(scaleGroupOfToken(spec(Granularity::per_tensor), 128, 999) == 0);
  CHECK(scaleGroupOfToken(spec(Granularity::per_token), 128, 77) == 77);
  CHECK(scaleGroupOfToken(spec(Granularity::per_block, 64), 64, 130) == 2); // 130 / 64
  CHECK(scaleGroupOfToken(spec(Granularity::per_warp, 32), 128, 100) == 3); // 100 / 32
  CHECK(scaleGroupOfToken(spec(Granularity::per_block, 0), 128, 300) == 2); // the tile: 300 / 128
  // per_thread, 32-token groups: tokens t, t + 8, t + 16, t + 24 of a group share a scale.
  const QuantizerSpec interleaved = spec(Granularity::per_thread, 32);
  CHECK(scaleGroupOfToken(interleaved, 128, 0) == 0);
  CHECK(scaleGroupOfToken(interleaved, 128, 8) == 0);
  CHECK(scaleGroupOfToken(interleaved, 128, 9) == 1);
  CHECK(scaleGroupOfToken(interleaved, 128, 31) == 7);
  CHECK(scaleGroupOfToken(interleaved, 128, 32) == 8);   // second group
  CHECK(scaleGroupOfToken(interleaved, 128, 45) == 13);  // 1 * 8 + 45 % 8
  CHECK(scaleGroupOfToken(interleaved, 128, 200) == 48); // 200 / 32 = 6 -> 6 * 8 + 200 % 8 = 48
  CHECK_THROWS_AS(scaleGroupOfToken(spec(Granularity::none), 128, 0), std::invalid_argument);
  CHECK_THROWS_AS(scaleGroupOfToken(spec(Granularity::per_token), 128, -1), std::invalid_argument);
}

TEST_CASE("computeWorkspaceLayout: SageAttn-B with an f16 V (hand-computed sizes and offsets)") {
  const AttentionVariant sage_b = variantOf(Granularity::per_block, 0, 0, false, true, false, VKind::f16);
  const WorkspaceLayout layout = computeWorkspaceLayout(sage_b, smallShape(), InputType::f16);
  CHECK(layout.padded_q == 384);  // 300 -> 3 blocks of 128
  CHECK(layout.padded_kv == 384); // 333 -> 6 blocks of 64
  CHECK(layout.q_scale_count == 3);
  CHECK(layout.k_scale_count == 6);
  CHECK(layout.q_codes.offset == 0);
  CHECK(layout.q_codes.bytes == 196608); // 2 * 4 * 384 * 64
  CHECK(layout.k_codes.offset == 196608);
  CHECK(layout.k_codes.bytes == 98304); // 2 * 2 * 384 * 64
  CHECK(layout.v_codes.bytes == 0);
  CHECK(layout.q_scales.offset == 294912);
  CHECK(layout.q_scales.bytes == 96); // 2 * 4 * 3 floats
  CHECK(layout.k_scales.offset == 295168);
  CHECK(layout.k_scales.bytes == 96); // 2 * 2 * 6 floats
  CHECK(layout.v_scales.bytes == 0);
  CHECK(layout.k_mean.offset == 295424);
  CHECK(layout.k_mean.bytes == 1024); // 2 * 2 * 64 floats
  CHECK(layout.q_mean.bytes == 0);
  CHECK(layout.v_mean.bytes == 0);
  // An f16, unsmoothed V is read in place: no f16 copy.
  CHECK(layout.v_values.bytes == 0);
  // The prologue's scratch for mean(K): 4 KV heads x (min(64, ceil(333 / 16) = 21) slices + the one-pass prologue's
  // combined mean) x 64 channels x 4 bytes.
  CHECK(layout.prologue_statistics.offset == 296448);
  CHECK(layout.prologue_statistics.bytes == 22528);
  // The one-pass prologue's ticket and one count per KV head, then the persistent attention kernel's tile counter.
  CHECK(layout.prologue_counters.offset == 318976);
  CHECK(layout.prologue_counters.bytes == 20);
  CHECK(layout.attention_counters.offset == 319232);
  CHECK(layout.attention_counters.bytes == 4);
  CHECK(layout.total_bytes == 319488);
  checkAlignedAndDisjoint(layout);

  // A bf16 input adds the prologue's f16 copy of V before the scratch; nothing else moves.
  const WorkspaceLayout bf16 = computeWorkspaceLayout(sage_b, smallShape(), InputType::bf16);
  CHECK(bf16.k_mean.offset == layout.k_mean.offset);
  CHECK(bf16.v_values.offset == 296448);
  CHECK(bf16.v_values.bytes == 196608); // 2 * 2 * 384 * 64 halves
  CHECK(bf16.prologue_statistics.offset == 493056);
  CHECK(bf16.total_bytes == 516096);
  checkAlignedAndDisjoint(bf16);

  // A smoothed f16 V is copied too (V - mean(V), rounded to f16).
  const AttentionVariant smooth_v = variantOf(Granularity::per_block, 0, 0, false, true, true, VKind::f16);
  CHECK(computeWorkspaceLayout(smooth_v, smallShape(), InputType::f16).v_values.bytes == 196608);
}

TEST_CASE("computeWorkspaceLayout: the exact preset stores Q and K in the input type (hand-computed)") {
  const AttentionVariant exact = dsl::preset("exact", 64)->describe(); // b_q 128, b_kv 64, nothing quantized
  CHECK(workspaceOperandBytes(exact.q) == 2);
  CHECK(workspaceOperandBytes(exact.k) == 2);
  CHECK(workspaceOperandBytes(spec(Granularity::per_block)) == 1);
  for (InputType input : {InputType::f16, InputType::bf16}) {
    const std::string input_name(nameOf(input));
    CAPTURE(input_name);
    const WorkspaceLayout layout = computeWorkspaceLayout(exact, smallShape(), input);
    CHECK(layout.padded_q == 384);
    CHECK(layout.padded_kv == 384);
    CHECK(layout.q_scale_count == 0);
    CHECK(layout.k_scale_count == 0);
    CHECK(layout.q_codes.offset == 0);
    CHECK(layout.q_codes.bytes == 393216); // 2 * 4 heads * 384 * 64 * 2 bytes
    CHECK(layout.k_codes.offset == 393216);
    CHECK(layout.k_codes.bytes == 196608); // 2 * 2 heads * 384 * 64 * 2 bytes
    for (const BufferSlice &unused :
         {layout.q_scales, layout.k_scales, layout.k_mean, layout.q_mean, layout.v_codes, layout.v_scales,
          layout.v_mean, layout.delta_s, layout.prologue_statistics, layout.prologue_counters})
      CHECK(unused.bytes == 0);
    // exact's f32 V runs through the f16 P.V: copied to f16 only from a bf16 input.
    CHECK(layout.v_values.offset == 589824);
    CHECK(layout.v_values.bytes == (input == InputType::bf16 ? 196608u : 0u));
    CHECK(layout.attention_counters.offset == (input == InputType::bf16 ? 786432u : 589824u));
    CHECK(layout.total_bytes == (input == InputType::bf16 ? 786688u : 590080u));
    checkAlignedAndDisjoint(layout);
  }
  // Row bytes are head_dim x 2 at d = 128 as well, with 37 KV tokens padded to one block of 64.
  const AttentionVariant exact_128 = dsl::preset("exact", 128)->describe();
  ProblemShape shape = smallShape();
  shape.head_dim = 128;
  shape.tokens_kv = 37;
  const WorkspaceLayout layout = computeWorkspaceLayout(exact_128, shape, InputType::f16);
  CHECK(layout.padded_kv == 64);
  CHECK(layout.q_codes.bytes == static_cast<size_t>(8 * 384 * 128 * 2));
  CHECK(layout.k_codes.bytes == static_cast<size_t>(4 * 64 * 128 * 2));
}

TEST_CASE("computeWorkspaceLayout: scale counts of every granularity, smoothing means and V codes") {
  const ProblemShape shape = smallShape();
  struct Expected {
    Granularity granularity;
    int q_group, k_group;
    int64_t q_scales, k_scales; // per (batch, head)
  };
  const Expected cases[] = {
      {Granularity::per_token, 0, 0, 384, 384},  // one per padded token
      {Granularity::per_block, 0, 0, 3, 6},      // one per block
      {Granularity::per_warp, 32, 64, 12, 6},    // 3 blocks x 4 warps; 6 blocks x 1
      {Granularity::per_thread, 32, 64, 96, 48}, // 3 x (4 x 8); 6 x (1 x 8)
      {Granularity::per_tensor, 0, 0, 1, 1},     // the whole sequence
  };
  for (const Expected &expected : cases) {
    CAPTURE(static_cast<int>(expected.granularity));
    const WorkspaceLayout layout = computeWorkspaceLayout(
        variantOf(expected.granularity, expected.q_group, expected.k_group, true, true, true, VKind::int8), shape,
        InputType::bf16);
    CHECK(layout.q_scale_count == expected.q_scales);
    CHECK(layout.k_scale_count == expected.k_scales);
    CHECK(layout.q_scales.bytes == static_cast<size_t>(8 * expected.q_scales * 4));
    CHECK(layout.k_scales.bytes == static_cast<size_t>(4 * expected.k_scales * 4));
    CHECK(layout.q_mean.bytes == 6144);   // 2 * 4 heads * 3 blocks * 64 floats
    CHECK(layout.delta_s.bytes == 36864); // 2 * 4 heads * 3 blocks * 384 padded tokens floats
    CHECK(layout.k_mean.bytes == 1024);   // 2 * 2 * 64 floats
    CHECK(layout.v_mean.bytes == 1024);   // 2 * 2 * 64 floats
    CHECK(layout.v_codes.bytes == 98304); // 2 * 2 * 64 channels * 384 padded tokens
    CHECK(layout.v_scales.bytes == 1024); // 2 * 2 * 64 floats
    CHECK(layout.v_values.bytes == 0);    // int8 V needs no f16 copy
    // Sums of K and V, min/max of V (and of a per-tensor K): 4 KV heads x (21 slices + 1 for the one-pass
    // prologue's combined statistics) x 64 channels x 12 (16) bytes; a per-tensor Q adds 8 Q heads x 3 blocks of
    // f32 amax.
    const bool per_tensor = expected.granularity == Granularity::per_tensor;
    CHECK(layout.prologue_statistics.bytes ==
          static_cast<size_t>(4 * 22 * 64 * (per_tensor ? 16 : 12) + (per_tensor ? 8 * 3 * 4 : 0)));
    checkAlignedAndDisjoint(layout);
  }
}

TEST_CASE("computeWorkspaceLayout: rejects shapes and quantizers it cannot lay out, naming them") {
  const AttentionVariant variant = variantOf(Granularity::per_block, 0, 0, false, true, false, VKind::f16);
  ProblemShape shape = smallShape();
  shape.head_dim = 128;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(variant, shape, InputType::f16), doctest::Contains("head_dim"),
                       std::invalid_argument);
  shape = smallShape();
  shape.heads_kv = 3; // does not divide 4
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(variant, shape, InputType::f16), doctest::Contains("heads_kv"),
                       std::invalid_argument);
  shape = smallShape();
  shape.tokens_kv = 0;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(variant, shape, InputType::f16), doctest::Contains("tokens_kv"),
                       std::invalid_argument);
  // e2m1 codes need microscales; int4 codes are laid out one per byte (the legalized s4 -> s8 operand).
  AttentionVariant fp4 = variant;
  fp4.q.dtype = ElementType::e2m1;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(fp4, smallShape(), InputType::f16), doctest::Contains("q quantizer"),
                       std::invalid_argument);
  AttentionVariant int4 = variant;
  int4.q.dtype = int4.k.dtype = ElementType::int4;
  CHECK(computeWorkspaceLayout(int4, smallShape(), InputType::f16).q_codes.bytes ==
        computeWorkspaceLayout(variant, smallShape(), InputType::f16).q_codes.bytes);
  AttentionVariant per_token_v = variant;
  per_token_v.v = spec(Granularity::per_token);
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(per_token_v, smallShape(), InputType::f16),
                       doctest::Contains("v quantizer"), std::invalid_argument);
  // An unquantized Q or K is a cast of a float type, stored in the input type; an unquantized V feeds an f16 P.V.
  AttentionVariant int8_cast = variant;
  int8_cast.k = prologue_test::tokenQuantizer(ElementType::int8, Granularity::none, 0);
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(int8_cast, smallShape(), InputType::f16),
                       doctest::Contains("k quantizer: granularity none is a cast"), std::invalid_argument);
  AttentionVariant bf16_v = variant;
  bf16_v.v = prologue_test::tokenQuantizer(ElementType::bf16, Granularity::none, 0);
  CHECK_THROWS_WITH_AS(
      computeWorkspaceLayout(bf16_v, smallShape(), InputType::bf16),
      doctest::Contains("v quantizer: expected per_channel codes, FP4 (e2m1 microscaled) codes or an f16/f32 cast"),
      std::invalid_argument);
}

TEST_CASE("computeWorkspaceLayout: a shape whose sizes overflow 64 bits is refused, never a wrapped size") {
  const AttentionVariant variant = variantOf(Granularity::per_block, 0, 0, false, true, false, VKind::f16);
  ProblemShape shape = smallShape();
  shape.tokens_q = int64_t(1) << 40;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(variant, shape, InputType::f16),
                       doctest::Contains("shape.tokens_q must be in [1, 2^31]"), std::invalid_argument);
  shape = smallShape();
  shape.batch = int64_t(1) << 40;
  shape.heads_q = shape.heads_kv = int64_t(1) << 20;
  shape.tokens_q = shape.tokens_kv = int64_t(1) << 31;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(variant, shape, InputType::f16), doctest::Contains("overflows 64 bits"),
                       std::invalid_argument);
  shape.batch = 1 << 20; // 2^20 x 2^20 heads x 2^31 tokens x 64 channels = 2^77 elements
  CHECK_THROWS_AS(computeWorkspaceLayout(variant, shape, InputType::f16), std::invalid_argument);
}

TEST_CASE("computeWorkspaceLayout: FP4 codes two per byte, one scale byte per microscale group") {
  const ProblemShape shape = smallShape(); // d 64, padded_q 384, padded_kv 384
  for (const char *name : {"sage3-fp4", "sage3-mxfp4"}) {
    CAPTURE(name);
    const int group = std::string(name) == "sage3-mxfp4" ? 32 : 16;
    const WorkspaceLayout layout = computeWorkspaceLayout(dsl::preset(name, 64)->describe(), shape, InputType::f16);
    CHECK(layout.q_codes.bytes == 8u * 384 * 32);    // b x h_q = 8 heads, d / 2 bytes per token
    CHECK(layout.k_codes.bytes == 4u * 384 * 32);    // b x h_kv = 4 heads
    CHECK(layout.q_scale_count == 384 * 64 / group); // per head: one byte per group of channels
    CHECK(layout.q_scales.bytes == static_cast<size_t>(8 * 384 * 64 / group));
    CHECK(layout.k_scales.bytes == static_cast<size_t>(4 * 384 * 64 / group));
    CHECK(layout.v_codes.bytes == 4u * 64 * 192);                              // V^T: d rows of padded_kv / 2 bytes
    CHECK(layout.v_scales.bytes == static_cast<size_t>(4 * 64 * 384 / group)); // along the tokens
    CHECK(layout.delta_s.bytes == 8u * 3 * 384 * 4);                           // Q is smoothed
    checkAlignedAndDisjoint(layout);
  }
  AttentionVariant odd = dsl::preset("sage3-mxfp4", 64)->describe();
  ProblemShape shape_48 = shape;
  odd.head_dim = shape_48.head_dim = 48;
  CHECK_THROWS_WITH_AS(computeWorkspaceLayout(odd, shape_48, InputType::f16),
                       doctest::Contains("q quantizer: head_dim 48 is not a multiple of its 32-channel"),
                       std::invalid_argument);
}
