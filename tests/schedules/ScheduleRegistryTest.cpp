// The registry: one list, ranked per arch, the best supported schedule planned, every reason reported otherwise.
// Fake schedules stand in for the ones that do not exist yet, so the ranking rules are tested, not only today's
// single entry.
#include "sage/schedules/ScheduleRegistry.h"

#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/TunableSpace.h"

#include "../codegen/TestVariants.h"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace sage;
using namespace sage::schedules;

namespace {

// Exists (and is preferred) on one arch only; refuses head dims other than `head_dim`.
class FakeSchedule final : public Schedule {
public:
  FakeSchedule(std::string_view name, GpuArch home, int head_dim) : name_(name), home_(home), head_dim_(head_dim) {}
  std::string_view name() const override { return name_; }
  std::string_view summary() const override { return "a test double"; }
  int preference(GpuArch arch) const override { return arch == home_ ? 10 : -1; }
  SupportResult supports(const AttentionVariant &variant, GpuArch arch, InputType) const override {
    if (arch != home_)
      return SupportResult::no(std::string(archName(home_)) + " only");
    if (variant.head_dim != head_dim_)
      return SupportResult::no("head_dim " + std::to_string(variant.head_dim) + " unsupported");
    return SupportResult::yes();
  }
  KernelPlan plan(const AttentionVariant &variant, GpuArch arch, InputType input,
                  std::optional<Tunables> tunables) const override {
    KernelPlan plan;
    plan.schedule = std::string(name_);
    plan.arch = arch;
    plan.input = input;
    plan.head_dim = variant.head_dim;
    plan.tunables = tunables.value_or(Tunables{});
    return plan;
  }
  TunableSpace tunableSpace(const AttentionVariant &, GpuArch, InputType) const override {
    return {std::string(name_), Tunables{}, {}};
  }

private:
  std::string_view name_;
  GpuArch home_;
  int head_dim_;
};

std::vector<std::string_view> namesOf(const std::vector<ScheduleVerdict> &verdicts) {
  std::vector<std::string_view> names;
  for (const ScheduleVerdict &verdict : verdicts)
    names.push_back(verdict.schedule);
  return names;
}

} // namespace

TEST_CASE("the list holds the sm80 schedule once and finds schedules by name") {
  const std::vector<const Schedule *> &schedules = allSchedules();
  REQUIRE(!schedules.empty());
  for (size_t i = 0; i < schedules.size(); ++i) {
    CHECK(!schedules[i]->summary().empty());
    CHECK(findSchedule(schedules[i]->name()) == schedules[i]);
    for (size_t j = i + 1; j < schedules.size(); ++j)
      CHECK(schedules[i]->name() != schedules[j]->name());
  }
  const Schedule *sm80 = findSchedule(Sm80Schedule::kName);
  REQUIRE(sm80 != nullptr);
  CHECK(sm80->name() == "sm80.mma_sync");
  CHECK(findSchedule("sm80") == nullptr);
  CHECK(findSchedule("") == nullptr);
}

TEST_CASE("schedules rank by their preference on the arch, ties in list order") {
  const Sm80Schedule sm80;
  const FakeSchedule hopper("fake.hopper", GpuArch::sm90a, 128);
  const FakeSchedule ampere("fake.ampere", GpuArch::sm80, 128);
  const std::vector<const Schedule *> list{&sm80, &hopper, &ampere};
  const AttentionVariant variant = test::presetVariant("sage-b", 128);

  CHECK(namesOf(scheduleVerdicts(list, variant, GpuArch::sm90a, InputType::f16)) ==
        std::vector<std::string_view>{"fake.hopper", "sm80.mma_sync", "fake.ampere"});
  CHECK(namesOf(scheduleVerdicts(list, variant, GpuArch::sm80, InputType::f16)) ==
        std::vector<std::string_view>{"fake.ampere", "sm80.mma_sync", "fake.hopper"});
  // On sm_89 neither fake exists: sm80 first, then the fakes in list order.
  CHECK(namesOf(scheduleVerdicts(list, variant, GpuArch::sm89, InputType::f16)) ==
        std::vector<std::string_view>{"sm80.mma_sync", "fake.hopper", "fake.ampere"});
  const std::vector<const Schedule *> ranked = rankSchedules(list, GpuArch::sm90a);
  REQUIRE(ranked.size() == 3);
  CHECK(ranked[0] == &hopper);
}

TEST_CASE("verdicts carry each schedule's own reason") {
  const Sm80Schedule sm80;
  const FakeSchedule hopper("fake.hopper", GpuArch::sm90a, 128);
  const std::vector<const Schedule *> list{&sm80, &hopper};
  const std::vector<ScheduleVerdict> verdicts =
      scheduleVerdicts(list, test::presetVariant("sage-b", 64), GpuArch::sm86, InputType::f16);
  REQUIRE(verdicts.size() == 2);
  CHECK(verdicts[0].schedule == "sm80.mma_sync");
  CHECK(verdicts[0].support.supported);
  CHECK(verdicts[0].support.reason.empty());
  CHECK(verdicts[1].schedule == "fake.hopper");
  CHECK(!verdicts[1].support.supported);
  CHECK(verdicts[1].support.reason == "sm_90a only");
}

TEST_CASE("the best supported schedule plans; a preferred one that refuses is passed over") {
  const Sm80Schedule sm80;
  const FakeSchedule hopper("fake.hopper", GpuArch::sm90a, 128);
  const std::vector<const Schedule *> list{&sm80, &hopper};
  CHECK(&bestSchedule(list, test::presetVariant("sage-b", 128), GpuArch::sm90a, InputType::f16) == &hopper);
  CHECK(&bestSchedule(list, test::presetVariant("sage-b", 64), GpuArch::sm90a, InputType::f16) == &sm80);
  CHECK(&bestSchedule(list, test::presetVariant("sage-b", 128), GpuArch::sm80, InputType::f16) == &sm80);
}

TEST_CASE("when no schedule supports the variant, the error lists every schedule's reason in rank order") {
  const Sm80Schedule sm80;
  const FakeSchedule hopper("fake.hopper", GpuArch::sm90a, 128);
  const std::vector<const Schedule *> list{&sm80, &hopper};
  const AttentionVariant variant = test::presetVariant("sage-b", 16);
  std::string message;
  try {
    bestSchedule(list, variant, GpuArch::sm90a, InputType::f16);
  } catch (const std::invalid_argument &error) {
    message = error.what();
  }
  CHECK(message.find("no schedule supports it on sm_90a") != std::string::npos);
  const size_t hopper_reason = message.find("fake.hopper: head_dim 16 unsupported");
  const size_t sm80_reason = message.find("sm80.mma_sync: head_dim 16");
  CHECK(hopper_reason != std::string::npos);
  CHECK(sm80_reason != std::string::npos);
  CHECK(hopper_reason < sm80_reason);
  // planBestSchedule over the real list keeps the same message.
  CHECK_THROWS_WITH_AS(planBestSchedule(variant, GpuArch::sm80, InputType::f16),
                       doctest::Contains("no schedule supports it on sm_80; sm80.mma_sync: head_dim 16"),
                       std::invalid_argument);
}

TEST_CASE("planBestSchedule and tunableSpace follow the best schedule of the real list") {
  const AttentionVariant variant = test::presetVariant("sage-b", 128, MaskKind::causal);
  for (GpuArch arch : {GpuArch::sm80, GpuArch::sm89, GpuArch::sm90a}) {
    const Schedule &best = bestSchedule(variant, arch, InputType::f16);
    CHECK(scheduleVerdicts(variant, arch, InputType::f16).front().schedule == best.name());
    const KernelPlan plan = planBestSchedule(variant, arch, InputType::f16);
    CHECK(plan.schedule == best.name());
    CHECK(plan.tunables == best.plan(variant, arch, InputType::f16).tunables);
    const TunableSpace space = tunableSpace(variant, arch, InputType::f16);
    CHECK(space.schedule == best.name());
    CHECK(space.defaults == plan.tunables);
  }
}
