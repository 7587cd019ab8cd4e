// The tuning sweep with a fake timer and a fake clock: rejections, order, budget cut-off, best and speedup, the
// database entry and the table. No GPU.
#include "sage/runtime/TuningSweep.h"

#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace sage;
using namespace sage::runtime;
using schedules::Tunables;

namespace {

const Tunables kDefault{128, 64, 8, 3};

// Each time() costs `time_cost` fake seconds; compile() costs `compile_cost`. Times are per tunables text.
struct FakeTimer : CandidateTimer {
  std::mutex mutex;
  double now = 100.0;
  double time_cost = 1.0, compile_cost = 0.0;
  std::map<std::string, double> milliseconds;
  std::set<std::string> compile_failures, check_failures, run_failures;
  std::vector<std::string> timed;
  std::set<std::string> compiled;
  std::set<std::thread::id> compile_threads;

  double clock() {
    std::lock_guard lock(mutex);
    return now;
  }
  void compile(const Tunables &tunables) override {
    std::lock_guard lock(mutex);
    compile_threads.insert(std::this_thread::get_id());
    now += compile_cost;
    if (compile_failures.count(schedules::tunablesText(tunables)))
      throw std::runtime_error("nvrtc: error: entry function uses too much shared data\nsecond line of the log");
    compiled.insert(schedules::tunablesText(tunables));
  }
  std::optional<std::string> check(const Tunables &tunables) override {
    if (check_failures.count(schedules::tunablesText(tunables)))
      return std::string("output differs: rel-L1 0.9000 to the CPU reference");
    return std::nullopt;
  }
  double time(const Tunables &tunables) override {
    std::lock_guard lock(mutex);
    const std::string text = schedules::tunablesText(tunables);
    if (run_failures.count(text))
      throw std::runtime_error("cuLaunchKernel: too many resources requested");
    now += time_cost;
    timed.push_back(text);
    auto found = milliseconds.find(text);
    return found == milliseconds.end() ? 2.0 : found->second;
  }
};

schedules::TunableSpace space() {
  schedules::TunableSpace s;
  s.schedule = "fake.schedule";
  s.defaults = kDefault;
  auto add = [&](Tunables t, std::string refusal = {}) {
    s.candidates.push_back(
        {t, refusal.empty() ? schedules::SupportResult::yes() : schedules::SupportResult::no(refusal)});
  };
  add({64, 64, 4, 2}); // 3 changes from the default
  add({128, 64, 8, 6}, "tunables.stages: 6 stages need 240000 bytes of shared memory");
  add({128, 64, 8, 4}); // 1 change
  add(kDefault);
  add({128, 32, 8, 3}); // 1 change
  add({128, 32, 4, 3}); // 2 changes
  add({64, 64, 8, 2});  // 2 changes
  return s;
}

SweepOptions options(FakeTimer &timer, double budget = 0.0, unsigned threads = 1) {
  SweepOptions o;
  o.budget_seconds = budget;
  o.compile_threads = threads;
  o.clock = [&timer] { return timer.clock(); };
  return o;
}

const CandidateResult &find(const SweepResult &result, Tunables tunables) {
  for (const CandidateResult &candidate : result.candidates)
    if (candidate.tunables == tunables)
      return candidate;
  FAIL("candidate not in the result");
  return result.candidates.front();
}

} // namespace

TEST_CASE("the default is measured first, then the nearest neighbours") {
  FakeTimer timer;
  const SweepResult result = runSweep(space(), timer, options(timer));
  REQUIRE(timer.timed.size() == 6);
  CHECK(timer.timed[0] == schedules::tunablesText(kDefault));
  // One change each; the one that keeps the pipeline depth first.
  CHECK(timer.timed[1] == "block_q=128,block_kv=32,warps=8,stages=3");
  CHECK(timer.timed[2] == "block_q=128,block_kv=64,warps=8,stages=4");
  CHECK(timer.timed[5] == "block_q=64,block_kv=64,warps=4,stages=2");
  CHECK(result.measured == 6);
  CHECK(result.rejected == 1);
  CHECK(result.skipped == 0);
  CHECK(result.schedule == "fake.schedule");
}

TEST_CASE("the best is the fastest measured candidate; the speedup is over the default") {
  FakeTimer timer;
  timer.milliseconds = {{schedules::tunablesText(kDefault), 2.0},
                        {"block_q=128,block_kv=32,warps=4,stages=3", 1.6},
                        {"block_q=64,block_kv=64,warps=8,stages=2", 1.0}};
  timer.check_failures = {"block_q=64,block_kv=64,warps=8,stages=2"}; // fastest, but wrong: not the best
  const SweepResult result = runSweep(space(), timer, options(timer));
  REQUIRE(result.best);
  CHECK(result.candidates[*result.best].tunables == Tunables{128, 32, 4, 3});
  REQUIRE(result.default_index);
  CHECK(result.candidates[*result.default_index].is_default);
  CHECK(result.speedup() == doctest::Approx(1.25));
  const CandidateResult &wrong = find(result, {64, 64, 8, 2});
  CHECK(wrong.status == CandidateStatus::rejected);
  CHECK(wrong.reason == "check: output differs: rel-L1 0.9000 to the CPU reference");
  // ok candidates come first, fastest first; rejected ones last.
  CHECK(result.candidates.front().tunables == Tunables{128, 32, 4, 3});
  CHECK(result.candidates.back().status == CandidateStatus::rejected);
  for (size_t i = 1; i < result.measured; ++i)
    CHECK(result.candidates[i - 1].milliseconds <= result.candidates[i].milliseconds);
}

TEST_CASE("rejections carry the schedule's, the compiler's and the launch's reasons") {
  FakeTimer timer;
  timer.compile_failures = {"block_q=128,block_kv=32,warps=8,stages=3"};
  timer.run_failures = {"block_q=64,block_kv=64,warps=4,stages=2"};
  const SweepResult result = runSweep(space(), timer, options(timer, 0.0, 3));
  CHECK(find(result, {128, 64, 8, 6}).reason == "tunables.stages: 6 stages need 240000 bytes of shared memory");
  CHECK(find(result, {128, 32, 8, 3}).reason.rfind("compile: nvrtc: error: entry function uses too much", 0) == 0);
  CHECK(find(result, {64, 64, 4, 2}).reason == "run: cuLaunchKernel: too many resources requested");
  CHECK(result.rejected == 3);
  CHECK(result.measured == 4);
  CHECK(timer.compiled.count("block_q=128,block_kv=64,warps=8,stages=6") == 0); // refused ones are never compiled
  const std::string table = sweepTable(result, {"sage-b", 128, false, "f16", 16, 16, 1024});
  CHECK(table.find("rejected: compile: nvrtc: error: entry function uses too much shared data\n") != std::string::npos);
  CHECK(table.find("second line of the log") == std::string::npos); // one line per candidate
  // Schedule refusals are summarized by reason instead of a row each.
  CHECK(table.find("refused by the schedule (1 candidate): tunables.stages: 6 stages need 240000 bytes of shared "
                   "memory\n") != std::string::npos);
  CHECK(table.find("rejected: tunables.stages") == std::string::npos);
  CHECK(find(result, {128, 64, 8, 6}).refused_by_schedule);
  CHECK_FALSE(find(result, {64, 64, 4, 2}).refused_by_schedule);
}

TEST_CASE("the budget stops new candidates and counts the skipped ones") {
  FakeTimer timer; // every timing costs one fake second
  const SweepResult result = runSweep(space(), timer, options(timer, 3.5));
  CHECK(timer.timed.size() == 3); // the third ends at 3 s; a fourth would end at 4 s > 3.5 s
  CHECK(result.measured == 3);
  CHECK(result.skipped == 3);
  CHECK(find(result, {64, 64, 4, 2}).status == CandidateStatus::skipped);
  CHECK(find(result, {64, 64, 4, 2}).reason == "over the budget");
  CHECK(result.default_index);
  const std::string table = sweepTable(result, {"sage-b", 128, false, "f16", 16, 16, 1024});
  CHECK(table.find("7 candidates: 3 measured, 1 rejected, 3 skipped by the budget") != std::string::npos);
}

TEST_CASE("the default is measured even when the budget is already spent") {
  FakeTimer timer;
  timer.time_cost = 10.0;
  const SweepResult result = runSweep(space(), timer, options(timer, 1.0));
  CHECK(timer.timed == std::vector<std::string>{schedules::tunablesText(kDefault)});
  CHECK(result.measured == 1);
  CHECK(result.skipped == 5);
  CHECK(result.speedup() == doctest::Approx(1.0));
}

TEST_CASE("compilation counts against the budget too, and runs on several threads") {
  FakeTimer timer;
  timer.time_cost = 0.0;
  timer.compile_cost = 1.0;
  const SweepResult unlimited = runSweep(space(), timer, options(timer, 0.0, 4));
  CHECK(unlimited.measured == 6);
  CHECK(timer.compile_threads.size() >= 1);
  CHECK(timer.compile_threads.size() <= 4);
  FakeTimer budgeted;
  budgeted.time_cost = 0.0;
  budgeted.compile_cost = 1.0;
  const SweepResult result = runSweep(space(), budgeted, options(budgeted, 2.5, 1));
  CHECK(result.measured == 2);
  CHECK(result.skipped == 4);
}

TEST_CASE("progress reports every candidate with the best so far and an ETA") {
  FakeTimer timer;
  timer.milliseconds = {{"block_q=128,block_kv=32,warps=8,stages=3", 1.0}};
  SweepOptions o = options(timer);
  std::vector<SweepProgress> reports;
  std::vector<double> best_ms;
  o.progress = [&](const SweepProgress &p) {
    reports.push_back(p);
    best_ms.push_back(p.best ? p.best->milliseconds : 0.0);
  };
  runSweep(space(), timer, o);
  REQUIRE(reports.size() == 6);
  CHECK(reports[0].done == 1);
  CHECK(reports[0].total == 6);
  CHECK(reports[0].eta_seconds == doctest::Approx(5.0)); // 1 s per candidate, 5 to go
  CHECK(best_ms[0] == 2.0);
  CHECK(best_ms[1] == 1.0);
  CHECK(best_ms[5] == 1.0);
  CHECK(reports[5].eta_seconds == 0.0);
}

TEST_CASE("the database entry of a sweep, and TOPS") {
  FakeTimer timer;
  timer.milliseconds = {{"block_q=128,block_kv=64,warps=8,stages=4", 1.0}};
  const SweepResult result = runSweep(space(), timer, options(timer));
  const TuningProblem problem{"sage-b", 128, true, "bf16", 16, 16, 1024};
  const std::optional<TuningEntry> entry = tuningEntry(result, problem, "2026-11-23T12:00:00Z");
  REQUIRE(entry);
  CHECK(entry->variant == "sage-b");
  CHECK(entry->causal);
  CHECK(entry->input == "bf16");
  CHECK(entry->tokens == 1024);
  CHECK(entry->tunables == "block_q=128,block_kv=64,warps=8,stages=4");
  CHECK(entry->milliseconds == 1.0);
  CHECK(entry->default_milliseconds == 2.0);
  // 4 * 16 * 16 * 1024^2 * 128 / 2 (causal) operations in 1 ms.
  CHECK(attentionTops(problem, 1.0) == doctest::Approx(4.0 * 16 * 16 * 1024.0 * 1024 * 128 / 2 / 1e-3 / 1e12));
  const std::string table = sweepTable(result, problem);
  CHECK(table.find("1.0000     68.7     2.000x  ok") != std::string::npos);
  CHECK(table.find("2.0000     34.4     1.000x  ok (default)") != std::string::npos);
  CHECK(table.find("2.000x the default") != std::string::npos);
}

TEST_CASE("without a measured default there is no speedup and no entry") {
  FakeTimer timer;
  timer.compile_failures = {schedules::tunablesText(kDefault)};
  const SweepResult result = runSweep(space(), timer, options(timer));
  CHECK_FALSE(result.default_index);
  CHECK(std::isnan(result.speedup()));
  CHECK_FALSE(tuningEntry(result, {"sage-b", 128, false, "f16", 1, 1, 64}, "now"));
  CHECK(sweepTable(result, {"sage-b", 128, false, "f16", 1, 1, 64}).find("no result") != std::string::npos);
}
