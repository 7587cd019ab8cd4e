// Which SLA sparse parts are exact (issue 13): their forward writes the LSE that the backward then reads instead of
// recomputing it; slaSparsePart is the variant SlaRunner compiles for the critical blocks.
#include "sage/dsl/Presets.h"
#include "sage/ir/AttentionVariant.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage;

namespace {

AttentionVariant presetVariant(const char *name, int head_dim = 128) { return dsl::preset(name, head_dim)->describe(); }

} // namespace

TEST_CASE("the exact SLA presets' sparse parts write their LSE, a quantized one does not") {
  for (int head_dim : {64, 128}) {
    CAPTURE(head_dim);
    for (const char *name : {"sla-f16", "sla-f16-elu"}) {
      CAPTURE(std::string(name));
      const AttentionVariant variant = presetVariant(name, head_dim);
      CHECK(slaSparsePartIsExact(variant));
      const AttentionVariant sparse = slaSparsePart(variant);
      CHECK_FALSE(sparse.sla.enabled);
      CHECK(sparse.epilogue.write_lse);
      CHECK_FALSE(sparse.epilogue.lse_smoothing_correction); // no K smoothing: L is that of S / sqrt(d) as it is
      AttentionVariant expected = variant;                   // everything else as the variant says
      expected.sla = SlaSpec{};
      expected.epilogue.write_lse = true;
      CHECK(sparse == expected);
    }
    const AttentionVariant int8 = presetVariant("sla-int8", head_dim);
    CHECK_FALSE(slaSparsePartIsExact(int8));
    const AttentionVariant sparse = slaSparsePart(int8);
    CHECK_FALSE(sparse.sla.enabled);
    CHECK_FALSE(sparse.epilogue.write_lse);
  }
}

TEST_CASE("any quantizer, smoothing or f16 accumulator makes the sparse part inexact") {
  const AttentionVariant exact = presetVariant("sla-f16");
  REQUIRE(slaSparsePartIsExact(exact));
  AttentionVariant variant = exact;
  variant.smooth_k = SmoothScope::sequence;
  CHECK_FALSE(slaSparsePartIsExact(variant));
  variant = exact;
  variant.v.granularity = Granularity::per_channel;
  CHECK_FALSE(slaSparsePartIsExact(variant));
  variant = exact;
  variant.p.static_scale = 1.0 / 127.0;
  CHECK_FALSE(slaSparsePartIsExact(variant));
  variant = exact;
  variant.q.dtype = ElementType::int8;
  CHECK_FALSE(slaSparsePartIsExact(variant));
  variant = exact;
  variant.pv.accumulator = AccumulatorType::f16;
  CHECK_FALSE(slaSparsePartIsExact(variant));
}
