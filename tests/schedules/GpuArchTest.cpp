// GpuArch: names, parsing, compute capabilities and what each arch's tensor cores can do.
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/GpuLimits.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace sage::schedules;

TEST_CASE("arch names round-trip through parseArch") {
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f}) {
    std::optional<GpuArch> parsed = parseArch(archName(arch));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == arch);
  }
  CHECK(archName(GpuArch::sm90a) == "sm_90a");
  CHECK(parseArch("sm90a") == GpuArch::sm90a);
  CHECK(parseArch("90a") == GpuArch::sm90a);
  CHECK(parseArch("sm_90") == GpuArch::sm90a); // only the arch-specific target exists
  CHECK(parseArch("89") == GpuArch::sm89);
  CHECK(parseArch("sm_100a") == GpuArch::sm100f); // the name before family targets
  CHECK(parseArch("120") == GpuArch::sm120f);
  CHECK_FALSE(parseArch("sm_75").has_value());
  CHECK_FALSE(parseArch("").has_value());
  CHECK_FALSE(parseArch("sm_8").has_value());
}

TEST_CASE("compute capabilities map onto the archs we generate for") {
  CHECK(archFromComputeCapability(8, 0) == GpuArch::sm80);
  CHECK(archFromComputeCapability(8, 6) == GpuArch::sm86);
  CHECK(archFromComputeCapability(8, 7) == GpuArch::sm86);
  CHECK(archFromComputeCapability(8, 9) == GpuArch::sm89);
  CHECK(archFromComputeCapability(9, 0) == GpuArch::sm90a);
  CHECK(archFromComputeCapability(10, 0) == GpuArch::sm100f);
  CHECK(archFromComputeCapability(12, 0) == GpuArch::sm120f);
  // Family targets: a B300 (10.3) and a GB10 (12.1) get images they can load ("a" images load only on x.0).
  CHECK(archFromComputeCapability(10, 3) == GpuArch::sm100f);
  CHECK(archFromComputeCapability(12, 1) == GpuArch::sm120f);
  CHECK(archName(GpuArch::sm100f) == "sm_100f");
  CHECK(archName(GpuArch::sm120f) == "sm_120f");
  CHECK_THROWS_AS(archFromComputeCapability(7, 5), std::invalid_argument);
  CHECK_THROWS_AS(archFromComputeCapability(9, 1), std::invalid_argument); // sm_90a would not load there
  CHECK_THROWS_AS(archFromComputeCapability(11, 0), std::invalid_argument);
  CHECK(computeCapability(GpuArch::sm89) == 89);
  CHECK(computeCapability(GpuArch::sm120f) == 120);
}

TEST_CASE("tensor-core features per arch") {
  CHECK(hasInt8MmaSync(GpuArch::sm80));
  CHECK_FALSE(hasFp8MmaSync(GpuArch::sm80));
  CHECK_FALSE(hasFp8MmaSync(GpuArch::sm86));
  CHECK(hasFp8MmaSync(GpuArch::sm89));
  CHECK(hasFp8MmaSync(GpuArch::sm90a));
  CHECK(hasWgmma(GpuArch::sm90a));
  CHECK_FALSE(hasWgmma(GpuArch::sm100f));
  CHECK(hasFp4BlockScaledMma(GpuArch::sm120f));
  CHECK_FALSE(hasFp4BlockScaledMma(GpuArch::sm100f)); // tcgen05 only there: not the mma.sync form
  CHECK_FALSE(hasFp4BlockScaledMma(GpuArch::sm90a));
}

TEST_CASE("shared-memory limits follow the programming guide") {
  CHECK(gpuLimits(GpuArch::sm80).max_dynamic_shared_bytes_per_block == 163 * 1024);
  CHECK(gpuLimits(GpuArch::sm86).max_dynamic_shared_bytes_per_block == 99 * 1024);
  CHECK(gpuLimits(GpuArch::sm89).max_dynamic_shared_bytes_per_block == 99 * 1024);
  CHECK(gpuLimits(GpuArch::sm90a).max_dynamic_shared_bytes_per_block == 227 * 1024);
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100f, GpuArch::sm120f}) {
    const GpuLimits limits = gpuLimits(arch);
    CHECK(limits.max_dynamic_shared_bytes_per_block < limits.shared_bytes_per_multiprocessor);
    CHECK(limits.registers_per_multiprocessor == 65536);
  }
}
