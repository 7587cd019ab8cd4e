// GpuArch: names, parsing, compute capabilities and what each arch's tensor cores can do.
#include "sage/schedules/GpuArch.h"
#include "sage/schedules/GpuLimits.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace sage::schedules;

TEST_CASE("arch names round-trip through parseArch") {
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100a, GpuArch::sm120a}) {
    std::optional<GpuArch> parsed = parseArch(archName(arch));
    REQUIRE(parsed.has_value());
    CHECK(*parsed == arch);
  }
  CHECK(archName(GpuArch::sm90a) == "sm_90a");
  CHECK(parseArch("sm90a") == GpuArch::sm90a);
  CHECK(parseArch("90a") == GpuArch::sm90a);
  CHECK(parseArch("sm_90") == GpuArch::sm90a); // only the arch-specific target exists
  CHECK(parseArch("89") == GpuArch::sm89);
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
  CHECK(archFromComputeCapability(10, 0) == GpuArch::sm100a);
  CHECK(archFromComputeCapability(12, 0) == GpuArch::sm120a);
  CHECK_THROWS_AS(archFromComputeCapability(7, 5), std::invalid_argument);
  CHECK(computeCapability(GpuArch::sm89) == 89);
  CHECK(computeCapability(GpuArch::sm120a) == 120);
}

TEST_CASE("tensor-core features per arch") {
  CHECK(hasInt8MmaSync(GpuArch::sm80));
  CHECK_FALSE(hasFp8MmaSync(GpuArch::sm80));
  CHECK_FALSE(hasFp8MmaSync(GpuArch::sm86));
  CHECK(hasFp8MmaSync(GpuArch::sm89));
  CHECK(hasFp8MmaSync(GpuArch::sm90a));
  CHECK(hasWgmma(GpuArch::sm90a));
  CHECK_FALSE(hasWgmma(GpuArch::sm100a));
  CHECK(hasFp4BlockScaledMma(GpuArch::sm120a));
  CHECK_FALSE(hasFp4BlockScaledMma(GpuArch::sm90a));
}

TEST_CASE("shared-memory limits follow the programming guide") {
  CHECK(gpuLimits(GpuArch::sm80).max_dynamic_shared_bytes_per_block == 163 * 1024);
  CHECK(gpuLimits(GpuArch::sm86).max_dynamic_shared_bytes_per_block == 99 * 1024);
  CHECK(gpuLimits(GpuArch::sm89).max_dynamic_shared_bytes_per_block == 99 * 1024);
  CHECK(gpuLimits(GpuArch::sm90a).max_dynamic_shared_bytes_per_block == 227 * 1024);
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm86, GpuArch::sm89, GpuArch::sm90a, GpuArch::sm100a, GpuArch::sm120a}) {
    const GpuLimits limits = gpuLimits(arch);
    CHECK(limits.max_dynamic_shared_bytes_per_block < limits.shared_bytes_per_multiprocessor);
    CHECK(limits.registers_per_multiprocessor == 65536);
  }
}
