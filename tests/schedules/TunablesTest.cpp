// Tunables: the defaults (Table 12, except d=128 with int8 Q.K^T and f16/int8 P.V: measured on an H100) and the
// canonical text form used in cache keys.
#include "sage/schedules/Tunables.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace sage;
using namespace sage::schedules;

TEST_CASE("defaults: Table 12 of the SageAttention paper, and the H100-measured row for d=128 int8 Q.K^T on sm_90a") {
  struct Row {
    const char *preset;
    int head_dim;
    MaskKind mask;
    int warps, stages; // Table 12, and on every arch but sm_90a
    int sm90_warps, sm90_stages;
  };
  for (Row row :
       {Row{"sage-b", 64, MaskKind::none, 4, 3, 4, 3}, Row{"sage-b", 64, MaskKind::causal, 4, 4, 4, 4},
        Row{"sage-b", 128, MaskKind::none, 8, 3, 4, 2}, Row{"sage-b", 128, MaskKind::causal, 8, 5, 4, 2},
        Row{"sage-vb", 128, MaskKind::none, 8, 3, 4, 2}, Row{"sage-vt", 128, MaskKind::causal, 8, 5, 4, 2},
        Row{"sage2-fp8", 128, MaskKind::none, 8, 3, 8, 3}, Row{"sage2-fp8", 128, MaskKind::causal, 8, 5, 8, 5},
        Row{"sage2-fp8", 64, MaskKind::causal, 4, 4, 4, 4}, Row{"exact", 128, MaskKind::none, 8, 3, 8, 3}}) {
    CAPTURE(row.preset);
    CAPTURE(row.head_dim);
    CAPTURE(static_cast<int>(row.mask));
    const AttentionVariant variant = test::presetVariant(row.preset, row.head_dim, row.mask);
    for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f}) {
      CAPTURE(archName(arch));
      const Tunables tunables = defaultTunables(variant, arch);
      const bool sm90 = arch == GpuArch::sm90a;
      CHECK(tunables.warps == (sm90 ? row.sm90_warps : row.warps));
      CHECK(tunables.stages == (sm90 ? row.sm90_stages : row.stages));
      CHECK(tunables.block_q == 128);
      CHECK(tunables.block_kv == 64);
    }
    CHECK(defaultTunables(variant) == defaultTunables(variant, GpuArch::sm80)); // the table's row
  }
}

TEST_CASE("the variant's own tiles are the default tiles") {
  AttentionVariant variant = test::presetVariant("sage-b", 64);
  variant.block_q = 64;
  variant.block_kv = 32;
  const Tunables tunables = defaultTunables(variant);
  CHECK(tunables.block_q == 64);
  CHECK(tunables.block_kv == 32);
}

TEST_CASE("tunables text is canonical and parses back") {
  const Tunables tunables{128, 64, 8, 4};
  CHECK(tunablesText(tunables) == "block_q=128,block_kv=64,warps=8,stages=4");
  CHECK(parseTunables(tunablesText(tunables), Tunables{}) == tunables);
  const Tunables partial = parseTunables("stages=2", tunables);
  CHECK(partial.stages == 2);
  CHECK(partial.warps == 8);
  // sm90's flag is written only when set, so that the text (and cache keys) of every other plan stay as they were
  Tunables inline_loads = tunables;
  inline_loads.inline_loads = true;
  CHECK(tunablesText(inline_loads) == "block_q=128,block_kv=64,warps=8,stages=4,inline_loads=1");
  CHECK(parseTunables(tunablesText(inline_loads), Tunables{}) == inline_loads);
  CHECK_FALSE(parseTunables("inline_loads=0", inline_loads).inline_loads);
  // and so is the CTA count of an inline-loads kernel
  Tunables four_ctas = inline_loads;
  four_ctas.ctas = 4;
  CHECK(tunablesText(four_ctas) == "block_q=128,block_kv=64,warps=8,stages=4,inline_loads=1,ctas=4");
  CHECK(parseTunables(tunablesText(four_ctas), Tunables{}) == four_ctas);
}

TEST_CASE("malformed tunables text names the problem") {
  CHECK_THROWS_WITH_AS(parseTunables("warps=four", Tunables{}), doctest::Contains("warps expects a positive integer"),
                       std::invalid_argument);
  // Issue 10: a repeated name is a mistake, not a choice of the last; zero and negative values are not tunables.
  CHECK_THROWS_WITH_AS(parseTunables("warps=4,warps=8", Tunables{}), doctest::Contains("warps is given twice"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("block_q=-64", Tunables{}),
                       doctest::Contains("block_q expects a positive integer"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("stages=0", Tunables{}), doctest::Contains("stages expects a positive integer"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("block_kv=99999999999", Tunables{}), doctest::Contains("block_kv expects"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("threads=4", Tunables{}), doctest::Contains("unknown name 'threads'"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("warps", Tunables{}), doctest::Contains("expected name=value"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("inline_loads=2", Tunables{}), doctest::Contains("inline_loads expects 0 or 1"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parseTunables("ctas=0", Tunables{}), doctest::Contains("ctas expects a positive integer"),
                       std::invalid_argument);
}
