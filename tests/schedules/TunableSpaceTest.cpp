// The sweep space of a schedule: every candidate carries the schedule's own verdict.
#include "sage/schedules/TunableSpace.h"

#include "sage/schedules/ScheduleRegistry.h"
#include "sage/schedules/Sm80Schedule.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

using namespace sage;
using namespace sage::schedules;

namespace {

const TunableCandidate *find(const TunableSpace &space, Tunables tunables) {
  auto found = std::find_if(space.candidates.begin(), space.candidates.end(),
                            [&](const TunableCandidate &c) { return c.tunables == tunables; });
  return found == space.candidates.end() ? nullptr : &*found;
}

} // namespace

TEST_CASE("the default plan is in the space and supported") {
  for (int head_dim : {64, 128})
    for (MaskKind mask : {MaskKind::none, MaskKind::causal}) {
      const AttentionVariant variant = test::presetVariant("sage-b", head_dim, mask);
      const TunableSpace space = tunableSpace(variant, GpuArch::sm90a, InputType::f16);
      CHECK(space.schedule == "sm90.wgmma_tma"); // the best schedule's space
      CHECK(space.defaults == planBestSchedule(variant, GpuArch::sm90a, InputType::f16).tunables);
      const TunableCandidate *defaults = find(space, space.defaults);
      REQUIRE(defaults != nullptr);
      CHECK(defaults->verdict.supported);
    }
}

TEST_CASE("every supported candidate plans, every refused one says why") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128);
  const TunableSpace space = tunableSpace(variant, GpuArch::sm80, InputType::f16);
  int supported = 0;
  for (const TunableCandidate &candidate : space.candidates) {
    CAPTURE(tunablesText(candidate.tunables));
    if (candidate.verdict.supported) {
      ++supported;
      CHECK(Sm80Schedule().plan(variant, GpuArch::sm80, InputType::f16, candidate.tunables).tunables ==
            candidate.tunables);
    } else {
      CHECK(!candidate.verdict.reason.empty());
    }
  }
  CHECK(supported >= 4);
  CHECK(supported < static_cast<int>(space.candidates.size()));
}

TEST_CASE("refusals name divisibility, registers and shared memory") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128); // b_q 128, b_kv 64, f16 V read in place
  const TunableSpace space = tunableSpace(variant, GpuArch::sm86, InputType::f16);
  auto reasonOf = [&](Tunables tunables) {
    const TunableCandidate *candidate = find(space, tunables);
    REQUIRE(candidate != nullptr);
    return candidate->verdict.reason;
  };
  CHECK(reasonOf({128, 128, 8, 2}).find("must divide the variant's block_kv 64") != std::string::npos);
  CHECK(reasonOf({128, 64, 16, 2}).find("multiple of 16 * warps (256)") != std::string::npos);
  CHECK(reasonOf({128, 64, 4, 2}).empty());
  CHECK(reasonOf({256, 64, 4, 2}).find("must divide the variant's block_q 128") != std::string::npos);
  // Q 16 KB + 6 stages x (K 8 KB + V 16 KB) = 160 KB: over sm_86's 99 KB, within sm_80's 163 KB.
  CHECK(reasonOf({128, 64, 8, 6}).find("shared memory") != std::string::npos);
  const TunableSpace sm80 = tunableSpace(variant, GpuArch::sm80, InputType::f16);
  const TunableCandidate *deep = find(sm80, {128, 64, 8, 6});
  REQUIRE(deep != nullptr);
  CHECK(deep->verdict.supported);
}

TEST_CASE("the register budget of a warp bounds its rows") {
  AttentionVariant variant = test::presetVariant("sage-b", 128);
  variant.block_q = 512; // Table 12's 8 warps (sm_80's default) give 64 rows per warp: the default plan exists
  const TunableSpace space = tunableSpace(variant, GpuArch::sm80, InputType::f16);
  const TunableCandidate *tall = find(space, {512, 64, 4, 3}); // 128 rows per warp: S and O leave the registers
  REQUIRE(tall != nullptr);
  CHECK(tall->verdict.reason.find("at most 64 rows per warp") != std::string::npos);
}

TEST_CASE("no schedule, no space") {
  AttentionVariant variant = test::presetVariant("sage-b", 128);
  variant.head_dim = 16; // below every schedule's head dims
  CHECK_THROWS_AS(tunableSpace(variant, GpuArch::sm80, InputType::f16), std::invalid_argument);
}
