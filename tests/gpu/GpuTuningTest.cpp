// Tuning on a real GPU: the event timer checks and times candidates, a short sweep runs end to end, and runners pick
// up the tuning database's tunables for this GPU. Skipped, with a message, where no GPU is present.
#include "../support/SkipWithoutGpu.h"
#include "sage/dsl/Presets.h"
#include "sage/runtime/AttentionRunner.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GpuCandidateTimer.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/runtime/TuningSweep.h"
#include "sage/schedules/TunableSpace.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <string>

using namespace sage;

namespace {

bool skipWithoutGpu() { return sage::test::skipWithoutGpu("gpu_tuning_test"); }

// The first supported candidate that is not the default.
schedules::Tunables otherCandidate(const schedules::TunableSpace &space) {
  for (const schedules::TunableCandidate &candidate : space.candidates)
    if (candidate.verdict.supported && !(candidate.tunables == space.defaults))
      return candidate.tunables;
  FAIL("the space has a single supported candidate");
  return space.defaults;
}

// Options for a runner of `program` on this GPU.
runtime::AttentionRunnerOptions optionsOnThisGpu(const ir::Program &program) {
  runtime::AttentionRunnerOptions options;
  options.arch = runtime::currentDeviceArch();
  options.ir_fingerprint = program.fingerprint();
  return options;
}

// A short timing of `bench`: 2 warm-up calls, the median of 5.
runtime::GpuTimingOptions shortTiming(const schedules::ProblemShape &bench) {
  runtime::GpuTimingOptions timing;
  timing.bench = bench;
  timing.warmup_calls = 2;
  timing.timed_calls = 5;
  return timing;
}

} // namespace

TEST_CASE("the GPU timer checks and times candidates") {
  if (skipWithoutGpu())
    return;
  const ir::Program program = dsl::preset("sage-b", 64)->build();
  const AttentionVariant variant = program.variant();
  const runtime::AttentionRunnerOptions base = optionsOnThisGpu(program);
  runtime::GpuCandidateTimer timer(variant, base, shortTiming({2, 4, 4, 1024, 1024, 64}));
  const schedules::TunableSpace space = schedules::tunableSpace(variant, *base.arch, schedules::InputType::f16);
  const schedules::Tunables other = otherCandidate(space);
  for (const schedules::Tunables &tunables : {space.defaults, other}) {
    CAPTURE(schedules::tunablesText(tunables));
    timer.compile(tunables);
    const std::optional<std::string> disagreement = timer.check(tunables);
    CHECK_MESSAGE(!disagreement, disagreement.value_or(""));
    const double milliseconds = timer.time(tunables);
    CHECK(milliseconds > 0.0);
    CHECK(milliseconds < 1000.0);
    std::printf("gpu_tuning_test: %s: %.4f ms\n", schedules::tunablesText(tunables).c_str(), milliseconds);
  }
}

TEST_CASE("a short sweep on the GPU") {
  if (skipWithoutGpu())
    return;
  const ir::Program program = dsl::preset("sage-b", 128, MaskKind::causal)->build();
  const runtime::AttentionRunnerOptions base = optionsOnThisGpu(program);
  runtime::GpuCandidateTimer timer(program.variant(), base, shortTiming({4, 8, 8, 2048, 2048, 128}));
  runtime::SweepOptions options;
  options.budget_seconds = 60.0;
  const runtime::SweepResult result = runtime::runSweep(
      schedules::tunableSpace(program.variant(), *base.arch, schedules::InputType::f16), timer, options);
  const runtime::TuningProblem problem{"sage-b", 128, true, "f16", 4, 8, 2048};
  std::printf("gpu_tuning_test: sweep\n%s", runtime::sweepTable(result, problem).c_str());
  REQUIRE(result.default_index);
  REQUIRE(result.best);
  CHECK(result.speedup() >= 1.0);
  for (const runtime::CandidateResult &candidate : result.candidates)
    CHECK_MESSAGE(candidate.reason.find("check:") == std::string::npos, candidate.reason);
}

TEST_CASE("runners use the tuning database's tunables for this GPU") {
  if (skipWithoutGpu())
    return;
  const ir::Program program = dsl::preset("sage-b", 64)->build();
  const AttentionVariant variant = program.variant();
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  const schedules::TunableSpace space = schedules::tunableSpace(variant, arch, schedules::InputType::f16);
  const schedules::Tunables other = otherCandidate(space);
  auto database = std::make_shared<runtime::TuningDatabase>();
  runtime::TuningEntry entry;
  entry.variant = "sage-b";
  entry.head_dim = 64;
  entry.input = "f16";
  entry.tokens = 1024;
  entry.tunables = schedules::tunablesText(other);
  entry.milliseconds = 1.0;
  entry.default_milliseconds = 1.1;
  entry.date = runtime::utcTimestamp();
  database->put(runtime::currentTuningDevice(std::string(schedules::archName(arch))), entry);

  runtime::AttentionRunnerOptions options;
  options.ir_fingerprint = program.fingerprint();
  options.tuning = database;
  const std::string tuned = runtime::AttentionRunner(variant, options).describe();
  CHECK(tuned.find(schedules::tunablesText(other) + "; tuned for N=1024") != std::string::npos);

  options.tunables = space.defaults; // explicit tunables win
  CHECK(runtime::AttentionRunner(variant, options).describe().find("; given)") != std::string::npos);

  options.tunables.reset();
  entry.tunables = "block_kv=128"; // the variant's b_kv is 64: the schedule refuses it
  database->put(runtime::currentTuningDevice(std::string(schedules::archName(arch))), entry);
  const std::string refused = runtime::AttentionRunner(variant, options).describe();
  CHECK(refused.find("schedule defaults; the tuned block_kv=128 was refused") != std::string::npos);

  options.tuning = std::make_shared<runtime::TuningDatabase>();
  CHECK(runtime::AttentionRunner(variant, options).describe().find("; schedule defaults)") != std::string::npos);
}
