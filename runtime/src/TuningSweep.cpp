// The sweep: order, parallel compilation, budget, checks and timings, and the result table.
#include "sage/runtime/TuningSweep.h"

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>

namespace sage::runtime {
namespace {

using schedules::Tunables;

int distance(const Tunables &a, const Tunables &b) {
  return (a.block_q != b.block_q) + (a.block_kv != b.block_kv) + (a.warps != b.warps) + (a.stages != b.stages);
}

std::string firstLine(const std::string &text) { return text.substr(0, text.find('\n')); }

std::string describeException(const std::exception_ptr &error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception &exception) {
    return exception.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Running means of the measured costs, to decide whether a candidate still fits the budget.
struct CostEstimate {
  double total = 0.0;
  size_t count = 0;
  void add(double seconds) {
    total += seconds;
    ++count;
  }
  bool known() const { return count > 0; }
  double mean() const { return count ? total / static_cast<double>(count) : 0.0; }
};

enum class CompileState { pending, compiled, failed, skipped };

struct CompileSlot {
  CompileState state = CompileState::pending;
  std::string error;
};

} // namespace

std::string_view nameOf(CandidateStatus status) {
  switch (status) {
  case CandidateStatus::ok:
    return "ok";
  case CandidateStatus::rejected:
    return "rejected";
  case CandidateStatus::skipped:
    return "skipped";
  }
  return "?";
}

double SweepResult::speedup() const {
  if (!best || !default_index)
    return std::numeric_limits<double>::quiet_NaN();
  return candidates[*default_index].milliseconds / candidates[*best].milliseconds;
}

SweepResult runSweep(const schedules::TunableSpace &space, CandidateTimer &timer, const SweepOptions &options) {
  const std::function<double()> clock = options.clock ? options.clock : [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const double start = clock();
  const double deadline = start + options.budget_seconds;
  const bool budgeted = options.budget_seconds > 0.0;

  std::vector<CandidateResult> results(space.candidates.size());
  std::vector<size_t> order; // the supported candidates, in measuring order
  for (size_t i = 0; i < space.candidates.size(); ++i) {
    const schedules::TunableCandidate &candidate = space.candidates[i];
    results[i].tunables = candidate.tunables;
    results[i].is_default = candidate.tunables == space.defaults;
    if (candidate.verdict.supported || results[i].is_default)
      order.push_back(i);
    else {
      results[i].status = CandidateStatus::rejected;
      results[i].reason = candidate.verdict.reason;
      results[i].refused_by_schedule = true;
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Tunables &x = results[a].tunables, &y = results[b].tunables;
    if (results[a].is_default != results[b].is_default)
      return results[a].is_default;
    const int dx = distance(x, space.defaults), dy = distance(y, space.defaults);
    if (dx != dy)
      return dx < dy;
    return std::abs(x.stages - space.defaults.stages) < std::abs(y.stages - space.defaults.stages);
  });

  // Compilation: worker threads take candidates in measuring order, ahead of the timing loop below.
  std::vector<CompileSlot> slots(order.size());
  std::mutex mutex;
  std::condition_variable compiled;
  std::atomic<size_t> next{0};
  bool stop = false;
  CostEstimate compile_cost;
  auto compileWorker = [&] {
    for (size_t j = next++; j < order.size(); j = next++) {
      bool give_up;
      {
        std::lock_guard lock(mutex);
        give_up = j > 0 && (stop || (budgeted && compile_cost.known() && clock() + compile_cost.mean() > deadline));
      }
      CompileSlot slot;
      slot.state = CompileState::skipped;
      const double began = clock();
      if (!give_up) {
        try {
          timer.compile(results[order[j]].tunables);
          slot.state = CompileState::compiled;
        } catch (...) {
          slot.state = CompileState::failed;
          slot.error = describeException(std::current_exception());
        }
      }
      std::lock_guard lock(mutex);
      if (!give_up)
        compile_cost.add(clock() - began);
      slots[j] = std::move(slot);
      compiled.notify_all();
    }
  };
  unsigned threads = options.compile_threads ? options.compile_threads : std::thread::hardware_concurrency();
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(std::max<size_t>(order.size(), 1))));
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads && !order.empty(); ++t)
    workers.emplace_back(compileWorker);

  // Checks and timings, one at a time on this thread (the GPU is measured alone).
  CostEstimate measure_cost;
  const CandidateResult *best = nullptr;
  for (size_t i = 0; i < order.size(); ++i) {
    CompileSlot slot;
    {
      std::unique_lock lock(mutex);
      compiled.wait(lock, [&] { return slots[i].state != CompileState::pending; });
      slot = slots[i];
    }
    CandidateResult &result = results[order[i]];
    if (slot.state == CompileState::skipped) {
      result.status = CandidateStatus::skipped;
      result.reason = "over the budget";
    } else if (slot.state == CompileState::failed) {
      result.status = CandidateStatus::rejected;
      result.reason = "compile: " + slot.error;
    } else if (i > 0 && budgeted && measure_cost.known() && clock() + measure_cost.mean() > deadline) {
      std::lock_guard lock(mutex);
      stop = true;
      result.status = CandidateStatus::skipped;
      result.reason = "over the budget";
    } else {
      const double began = clock();
      try {
        if (std::optional<std::string> disagreement = timer.check(result.tunables)) {
          result.status = CandidateStatus::rejected;
          result.reason = "check: " + *disagreement;
        } else {
          result.milliseconds = timer.time(result.tunables);
          result.status = CandidateStatus::ok;
        }
      } catch (...) {
        result.status = CandidateStatus::rejected;
        result.reason = "run: " + describeException(std::current_exception());
      }
      measure_cost.add(clock() - began);
      if (result.status == CandidateStatus::ok && (!best || result.milliseconds < best->milliseconds))
        best = &result;
    }
    if (options.progress) {
      SweepProgress progress;
      progress.done = i + 1;
      progress.total = order.size();
      progress.latest = &result;
      progress.best = best;
      progress.elapsed_seconds = clock() - start;
      progress.eta_seconds = progress.elapsed_seconds / static_cast<double>(progress.done) *
                             static_cast<double>(progress.total - progress.done);
      if (budgeted)
        progress.eta_seconds = std::max(0.0, std::min(progress.eta_seconds, deadline - clock()));
      options.progress(progress);
    }
  }
  for (std::thread &worker : workers)
    worker.join();

  SweepResult sweep;
  sweep.schedule = space.schedule;
  auto rank = [](const CandidateResult &r) {
    return r.status == CandidateStatus::ok ? 0 : r.status == CandidateStatus::skipped ? 1 : 2;
  };
  std::stable_sort(results.begin(), results.end(), [&](const CandidateResult &a, const CandidateResult &b) {
    if (rank(a) != rank(b))
      return rank(a) < rank(b);
    return rank(a) == 0 && a.milliseconds < b.milliseconds;
  });
  sweep.candidates = std::move(results);
  for (size_t i = 0; i < sweep.candidates.size(); ++i) {
    const CandidateResult &result = sweep.candidates[i];
    if (result.is_default)
      sweep.default_index = i;
    if (result.status == CandidateStatus::ok) {
      ++sweep.measured;
      if (!sweep.best)
        sweep.best = i;
    } else if (result.status == CandidateStatus::rejected)
      ++sweep.rejected;
    else
      ++sweep.skipped;
  }
  if (sweep.default_index && sweep.candidates[*sweep.default_index].status != CandidateStatus::ok)
    sweep.default_index.reset(); // no baseline: speedup() and tuningEntry() say so
  sweep.seconds = clock() - start;
  return sweep;
}

double attentionTops(const TuningProblem &problem, double milliseconds) {
  const double n = static_cast<double>(problem.tokens);
  double operations = 4.0 * static_cast<double>(problem.batch) * static_cast<double>(problem.heads) * n * n *
                      static_cast<double>(problem.head_dim);
  if (problem.causal)
    operations /= 2.0;
  return operations / (milliseconds * 1e-3) / 1e12;
}

std::optional<TuningEntry> tuningEntry(const SweepResult &result, const TuningProblem &problem, std::string date) {
  if (!result.best || !result.default_index)
    return std::nullopt;
  TuningEntry entry;
  entry.variant = problem.variant;
  entry.head_dim = problem.head_dim;
  entry.causal = problem.causal;
  entry.input = problem.input;
  entry.tokens = problem.tokens;
  entry.tunables = schedules::tunablesText(result.candidates[*result.best].tunables);
  entry.milliseconds = result.candidates[*result.best].milliseconds;
  entry.default_milliseconds = result.candidates[*result.default_index].milliseconds;
  entry.date = std::move(date);
  return entry;
}

std::string sweepTable(const SweepResult &result, const TuningProblem &problem) {
  std::string text = fmt::format("{:>7} {:>8} {:>5} {:>6} {:>6} {:>4} {:>10} {:>8} {:>10}  {}\n", "block_q", "block_kv",
                                 "warps", "stages", "inline", "ctas", "median_ms", "TOPS", "vs_default", "status");
  const double default_ms = result.default_index ? result.candidates[*result.default_index].milliseconds : std::nan("");
  // Candidates the schedule refused before compiling are many and alike: one line per distinct reason, after the
  // rows of the candidates that were compiled.
  std::vector<std::pair<std::string, size_t>> refusals;
  for (const CandidateResult &candidate : result.candidates) {
    const Tunables &t = candidate.tunables;
    if (candidate.refused_by_schedule) {
      // The reason up to its number ("...: must divide the variant's block_q 128 ..., got 256") groups alike ones.
      const std::string reason = firstLine(candidate.reason);
      const std::string kind = reason.substr(0, reason.find(", got"));
      auto found = std::find_if(refusals.begin(), refusals.end(), [&](const auto &item) { return item.first == kind; });
      if (found == refusals.end())
        refusals.emplace_back(kind, 1);
      else
        ++found->second;
      continue;
    }
    std::string status(nameOf(candidate.status));
    if (!candidate.reason.empty())
      status += ": " + firstLine(candidate.reason);
    if (candidate.is_default)
      status += " (default)";
    // sm90's inline loads and their CTA count ("-": the schedule's)
    const std::string ctas = t.ctas != 0 ? std::to_string(t.ctas) : "-";
    if (candidate.status == CandidateStatus::ok)
      text += fmt::format("{:>7} {:>8} {:>5} {:>6} {:>6} {:>4} {:>10.4f} {:>8.1f} {:>9.3f}x  {}\n", t.block_q,
                          t.block_kv, t.warps, t.stages, t.inline_loads ? 1 : 0, ctas, candidate.milliseconds,
                          attentionTops(problem, candidate.milliseconds), default_ms / candidate.milliseconds, status);
    else
      text += fmt::format("{:>7} {:>8} {:>5} {:>6} {:>6} {:>4} {:>10} {:>8} {:>10}  {}\n", t.block_q, t.block_kv,
                          t.warps, t.stages, t.inline_loads ? 1 : 0, ctas, "-", "-", "-", status);
  }
  for (const auto &[reason, count] : refusals)
    text += fmt::format("refused by the schedule ({} candidate{}): {}\n", count, count == 1 ? "" : "s", reason);
  text += fmt::format("{} candidates: {} measured, {} rejected, {} skipped by the budget, in {:.1f} s\n",
                      result.candidates.size(), result.measured, result.rejected, result.skipped, result.seconds);
  if (result.best && result.default_index)
    text += fmt::format("best: {} at {:.4f} ms ({:.1f} TOPS), {:.3f}x the default {} ({:.4f} ms)\n",
                        schedules::tunablesText(result.candidates[*result.best].tunables),
                        result.candidates[*result.best].milliseconds,
                        attentionTops(problem, result.candidates[*result.best].milliseconds), result.speedup(),
                        schedules::tunablesText(result.candidates[*result.default_index].tunables), default_ms);
  else
    text += "no result: the default configuration was not measured\n";
  return text;
}

} // namespace sage::runtime
