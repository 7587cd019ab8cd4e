// `sagegen tune`: sweeps the schedule's tunables on this GPU and records the fastest in the tuning database;
// `sagegen tune --show` prints the database.
#include "KernelSetOptions.h"

#include "sage/ir/Program.h"
#include "sage/runtime/CudaDriver.h"
#include "sage/runtime/DeviceArch.h"
#include "sage/runtime/GpuCandidateTimer.h"
#include "sage/runtime/TuningDatabase.h"
#include "sage/runtime/TuningSweep.h"
#include "sage/schedules/TunableSpace.h"

#include <fmt/core.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace sage::tool {
namespace {

constexpr int64_t kBenchTokensPerCall = 16384; // the benchmark: 16k tokens per call, hidden size 2048
constexpr int64_t kBenchHidden = 2048;

constexpr int64_t kMaxTuneTokens = int64_t(1) << 24;

struct TuneOptions {
  PresetOptions preset;
  std::string input = "f16";
  std::vector<int64_t> tokens;
  std::string batch_heads;
  double budget_seconds = 0.0;
  std::string database;
  bool show = false;
  unsigned threads = 0;
  int warmup = 5, repeats = 20;
};

std::filesystem::path databasePath(const TuneOptions &options) {
  std::filesystem::path path =
      options.database.empty() ? runtime::TuningDatabase::defaultPath() : std::filesystem::path(options.database);
  if (path.empty())
    throw UserError("--db: no default tuning database path ($SAGEGEN_TUNING_DB, $SAGEGEN_CACHE_DIR, "
                    "$XDG_CACHE_HOME and $HOME are unset); name one");
  return path;
}

void show(const TuneOptions &options) {
  const std::filesystem::path path = databasePath(options);
  runtime::TuningDatabase database;
  try {
    database = runtime::TuningDatabase::read(path);
  } catch (const runtime::TuningDatabaseError &error) {
    throw UserError(std::string("--db: ") + error.what());
  }
  if (database.empty()) {
    fmt::print("tuning database {}: no entries\n", path.string());
    return;
  }
  fmt::print("tuning database {}\n", path.string());
  for (const runtime::TuningGroup &group : database.groups()) {
    fmt::print("\n{} ({}, sagegen {})\n", group.device.gpu, group.device.arch, group.device.sagegen_version);
    fmt::print("{:<12} {:>4} {:>6} {:>5} {:>7}  {:<42} {:>9} {:>10} {:>8}  {}\n", "variant", "d", "causal", "input",
               "N", "tunables", "ms", "default_ms", "speedup", "date");
    for (const runtime::TuningEntry &entry : group.entries)
      fmt::print("{:<12} {:>4} {:>6} {:>5} {:>7}  {:<42} {:>9.4f} {:>10.4f} {:>7.3f}x  {}\n", entry.variant,
                 entry.head_dim, entry.causal ? "yes" : "no", entry.input, entry.tokens, entry.tunables,
                 entry.milliseconds, entry.default_milliseconds, entry.default_milliseconds / entry.milliseconds,
                 entry.date);
  }
}

// "BxH" -> {B, H}.
std::pair<int64_t, int64_t> parseBatchHeads(const std::string &text) {
  const size_t x = text.find('x');
  try {
    size_t used_batch = 0, used_heads = 0;
    const std::string batch = text.substr(0, x), heads = x == std::string::npos ? "" : text.substr(x + 1);
    const long long b = std::stoll(batch, &used_batch), h = std::stoll(heads, &used_heads);
    if (used_batch == batch.size() && used_heads == heads.size() && b > 0 && h > 0 && b <= 65535 && h <= 4096)
      return {b, h};
  } catch (const std::exception &) {
  }
  throw UserError("--batch-heads: expected BATCHxHEADS with BATCH in [1, 65535] and HEADS in [1, 4096] (e.g. 16x16), "
                  "got '" +
                  text + "'");
}

// One line per candidate when stderr is a file or pipe; one self-overwriting status line on a terminal.
std::function<void(const runtime::SweepProgress &)> progressPrinter(int64_t tokens) {
  const bool terminal = ::isatty(::fileno(stderr)) != 0;
  return [terminal, tokens](const runtime::SweepProgress &progress) {
    const std::string best = progress.best ? fmt::format("best {:.4f} ms ({})", progress.best->milliseconds,
                                                         schedules::tunablesText(progress.best->tunables))
                                           : std::string("no best yet");
    if (terminal) {
      fmt::print(stderr, "\r\x1b[Ktune N={}: {}/{} done, {}, ETA {:.0f} s", tokens, progress.done, progress.total, best,
                 progress.eta_seconds);
      if (progress.done == progress.total)
        fmt::print(stderr, "\n");
    } else {
      const runtime::CandidateResult &latest = *progress.latest;
      fmt::print(stderr, "tune N={}: {}/{} {}: {}{}; {}, ETA {:.0f} s\n", tokens, progress.done, progress.total,
                 schedules::tunablesText(latest.tunables), runtime::nameOf(latest.status),
                 latest.status == runtime::CandidateStatus::ok ? fmt::format(" {:.4f} ms", latest.milliseconds)
                                                               : std::string(),
                 best, progress.eta_seconds);
    }
    std::fflush(stderr);
  };
}

void tune(const TuneOptions &options) {
  if (options.tokens.empty())
    throw UserError("--n: give at least one sequence length to tune for");
  for (int64_t n : options.tokens)
    if (n <= 0 || n > kMaxTuneTokens)
      throw UserError("--n: expected positive sequence lengths, got " + std::to_string(n) + " (the limit is 2^24)");
  const schedules::InputType input = parseInputOption(options.input);
  if (!(options.budget_seconds >= 0) || !std::isfinite(options.budget_seconds)) // NaN fails the first test
    throw UserError("--budget: expected a finite, non-negative number of seconds");
  if (options.warmup < 0 || options.repeats < 1)
    throw UserError("--warmup, --repeats: expected >= 0 and >= 1");
  std::optional<std::pair<int64_t, int64_t>> batch_heads;
  if (!options.batch_heads.empty())
    batch_heads = parseBatchHeads(options.batch_heads);
  if (options.preset.preset.empty())
    throw UserError("--preset: name the preset to tune (see `sagegen list`)");
  const ir::Program program = options.preset.builder(options.preset.preset).build();
  const AttentionVariant variant = program.variant();
  const std::filesystem::path path = databasePath(options);

  const runtime::CudaDriver &driver = runtime::CudaDriver::instance();
  if (!driver.available())
    throw UserError("tune measures kernels on a GPU, and there is none: " + driver.status().reason);
  const schedules::GpuArch arch = runtime::currentDeviceArch();
  const schedules::TunableSpace space = schedules::tunableSpace(variant, arch, input);
  const runtime::TuningDevice device = runtime::currentTuningDevice(std::string(schedules::archName(arch)));

  runtime::AttentionRunnerOptions base;
  base.input = input;
  base.arch = arch;
  base.ir_fingerprint = program.fingerprint();
  std::vector<runtime::TuningEntry> entries;
  std::vector<int64_t> unmeasured; // N whose default configuration failed: no baseline, no entry
  double budget_left = options.budget_seconds;
  for (size_t i = 0; i < options.tokens.size(); ++i) {
    const int64_t n = options.tokens[i];
    runtime::TuningProblem problem;
    problem.variant = options.preset.preset;
    problem.head_dim = variant.head_dim;
    problem.causal = options.preset.causal;
    problem.input = options.input;
    problem.tokens = n;
    problem.batch = batch_heads ? batch_heads->first : std::max<int64_t>(1, kBenchTokensPerCall / n);
    problem.heads = batch_heads ? batch_heads->second : std::max<int64_t>(1, kBenchHidden / variant.head_dim);
    fmt::print("{} d{} {} {} on {} ({}): batch {} x heads {} x N {}, {} candidates of {}\n", problem.variant,
               problem.head_dim, problem.causal ? "causal" : "full", problem.input, device.gpu, device.arch,
               problem.batch, problem.heads, n, space.candidates.size(), space.schedule);
    std::fflush(stdout);

    runtime::GpuTimingOptions timing;
    timing.bench = {problem.batch, problem.heads, problem.heads, n, n, variant.head_dim};
    timing.warmup_calls = options.warmup;
    timing.timed_calls = options.repeats;
    runtime::GpuCandidateTimer timer(variant, base, timing);
    runtime::SweepOptions sweep_options;
    sweep_options.compile_threads = options.threads;
    sweep_options.progress = progressPrinter(n);
    // Each remaining N gets an equal share of what is left of the budget.
    if (options.budget_seconds > 0)
      sweep_options.budget_seconds = std::max(1e-3, budget_left / static_cast<double>(options.tokens.size() - i));
    const runtime::SweepResult result = runtime::runSweep(space, timer, sweep_options);
    budget_left -= result.seconds;
    fmt::print("{}\n", runtime::sweepTable(result, problem));
    std::fflush(stdout);
    if (std::optional<runtime::TuningEntry> entry = runtime::tuningEntry(result, problem, runtime::utcTimestamp()))
      entries.push_back(std::move(*entry));
    else
      unmeasured.push_back(n);
  }
  std::vector<std::string> warnings;
  try {
    runtime::TuningDatabase::store(path, device, entries, warnings);
  } catch (const runtime::TuningDatabaseError &error) {
    throw UserError(std::string("--db: ") + error.what());
  }
  for (const std::string &warning : warnings)
    fmt::print(stderr, "sagegen: warning: {}\n", warning);
  fmt::print("wrote {} entr{} to {}\n", entries.size(), entries.size() == 1 ? "y" : "ies", path.string());
  if (!unmeasured.empty())
    throw std::runtime_error(fmt::format("the default configuration could not be measured at N={}: no entry for it "
                                         "(its status is in the table above)",
                                         unmeasured.front()));
}

} // namespace

CommandAction addTuneCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand(
      "tune", "sweep the schedule's tunables on this GPU and record the fastest in the tuning database");
  auto options = std::make_shared<TuneOptions>();
  options->preset.preset.clear();
  command->add_option("--preset", options->preset.preset, "the preset to tune (see `sagegen list`)");
  options->preset.addTo(*command, false);
  command->add_option("--input", options->input, "storage type of Q, K, V, O: f16 or bf16")->capture_default_str();
  command->add_option("--n", options->tokens, "sequence length(s) to tune for (repeatable, comma-separated)")
      ->delimiter(',');
  command->add_option("--batch-heads", options->batch_heads,
                      "BATCHxHEADS of the timed problem (default: 16384/N x 2048/headdim, the issue's benchmark)");
  command
      ->add_option("--budget", options->budget_seconds,
                   "seconds for the whole run: no candidate starts past it (0: no limit)")
      ->capture_default_str();
  command->add_option("--db", options->database,
                      "the tuning database (default: $SAGEGEN_TUNING_DB, else tuning.json in the kernel cache)");
  command->add_flag("--show", options->show, "print the tuning database and exit");
  command->add_option("--threads", options->threads, "compiler threads (default: one per CPU thread)");
  command->add_option("--warmup", options->warmup, "untimed calls before timing a candidate")->capture_default_str();
  command->add_option("--repeats", options->repeats, "timed calls per candidate (the median is kept)")
      ->capture_default_str();
  return [options] {
    if (options->show)
      show(*options);
    else
      tune(*options);
  };
}

} // namespace sage::tool
