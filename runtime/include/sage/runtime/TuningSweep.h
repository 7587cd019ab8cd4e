// The tuning sweep of `sagegen tune`: the schedule's candidate tunables, minus those the schedule refuses, compiled in
// parallel on CPU threads, checked against the default configuration's output and timed one after another. Compiling,
// checking and timing go through CandidateTimer, so the whole sweep (rejections, budget, order, result) runs in CI
// with a fake timer; GpuCandidateTimer is the real one.
#pragma once

#include "sage/runtime/TuningDatabase.h"
#include "sage/schedules/TunableSpace.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

class CandidateTimer {
public:
  virtual ~CandidateTimer() = default;
  // Compiles (or finds in the kernel cache) the candidate's kernels. Called from several threads at once; throws on
  // failure (the message becomes the rejection reason).
  virtual void compile(const schedules::Tunables &tunables) = 0;
  // Runs the candidate on the small check problem; the reason when its output disagrees with the default
  // configuration's or the CPU reference's, nothing when it agrees. The default is checked first.
  virtual std::optional<std::string> check(const schedules::Tunables &tunables) = 0;
  // The median time of one call (prologue + attention) in milliseconds, after a warm-up. Throws on failure.
  virtual double time(const schedules::Tunables &tunables) = 0;
};

enum class CandidateStatus { ok, rejected, skipped };
std::string_view nameOf(CandidateStatus status);

struct CandidateResult {
  schedules::Tunables tunables;
  CandidateStatus status = CandidateStatus::skipped;
  std::string reason;               // rejected: the schedule's, the compiler's, the check's or the launch's reason
  double milliseconds = 0.0;        // ok: median time of one call
  bool is_default = false;          // the schedule's default configuration (always measured)
  bool refused_by_schedule = false; // rejected before compiling, by the schedule's own checks
};

struct SweepProgress {
  size_t done = 0, total = 0; // candidates measured or given up, of those the schedule supports
  const CandidateResult *latest = nullptr;
  const CandidateResult *best = nullptr; // fastest so far, if any
  double elapsed_seconds = 0.0;
  double eta_seconds = 0.0;
};

struct SweepOptions {
  double budget_seconds = 0.0;   // 0: no limit; otherwise no candidate starts when it would end past the budget
  unsigned compile_threads = 0;  // 0: the hardware's threads
  std::function<double()> clock; // seconds, monotonic; empty: std::chrono::steady_clock
  std::function<void(const SweepProgress &)> progress; // after every candidate
};

struct SweepResult {
  std::string schedule;
  std::vector<CandidateResult> candidates; // ok fastest first, then skipped, then rejected (schedule's order)
  size_t measured = 0, rejected = 0, skipped = 0;
  std::optional<size_t> best;          // index of the fastest ok candidate
  std::optional<size_t> default_index; // index of the default configuration
  double seconds = 0.0;                // the sweep's duration

  // Default time over best time (1 when the default is the best); NaN when either was not measured.
  double speedup() const;
};

// Runs the sweep. Candidates are measured default first, then by distance from the default (fewest tunables changed
// first), so a budget cut keeps the most plausible neighbours. Never throws for a candidate's failure.
SweepResult runSweep(const schedules::TunableSpace &space, CandidateTimer &timer, const SweepOptions &options);

// The problem a sweep measures, for throughput and for the database key.
struct TuningProblem {
  std::string variant; // preset name or IR fingerprint
  int head_dim = 128;
  bool causal = false;
  std::string input = "f16";
  int64_t batch = 1, heads = 1, tokens = 1024;
};

// 4 b h N^2 d floating-point operations (halved when causal) over `milliseconds`, in TOPS.
double attentionTops(const TuningProblem &problem, double milliseconds);

// The database entry of a finished sweep (nothing when the best or the default was not measured).
std::optional<TuningEntry> tuningEntry(const SweepResult &result, const TuningProblem &problem, std::string date);

// The result as a table: tunables, status (ok / rejected: reason / skipped), median ms, TOPS, speedup vs default.
std::string sweepTable(const SweepResult &result, const TuningProblem &problem);

} // namespace sage::runtime
