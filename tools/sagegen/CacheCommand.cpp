// `sagegen cache ls|verify|clear|warm`: the on-disk kernel cache ($SAGEGEN_CACHE_DIR, else the XDG default).
#include "KernelSetOptions.h"

#include "sage/runtime/KernelCache.h"

#include <fmt/core.h>

#include <filesystem>
#include <memory>

namespace sage::tool {
namespace {

struct CacheCommandOptions {
  std::string directory; // --dir; empty: the default cache directory
  bool fix = false;
  bool backward = false; // warm: --preset names a backward preset
  KernelSetOptions kernels;
};

// --dir, which must exist when `must_exist` (commands that only read or delete), or the default cache directory
// (which may not exist yet: then the cache is simply empty).
std::filesystem::path cacheDirectory(const CacheCommandOptions &options, bool must_exist) {
  std::filesystem::path directory = options.directory;
  if (directory.empty()) {
    directory = runtime::KernelCache::defaultCacheDirectory();
    if (directory.empty())
      throw UserError("--dir: no cache directory given and none configured (SAGEGEN_CACHE_DIR, XDG_CACHE_HOME, HOME)");
  } else if (must_exist && !std::filesystem::is_directory(directory)) {
    throw UserError(fmt::format("--dir: '{}' is not a directory", directory.string()));
  }
  return directory;
}

runtime::KernelCache openCache(const std::filesystem::path &directory, runtime::CacheWarningSink sink = {}) {
  runtime::KernelCacheOptions cache_options;
  cache_options.directory = directory;
  cache_options.warning_sink = std::move(sink);
  return runtime::KernelCache(cache_options);
}

std::string humanBytes(std::uint64_t bytes) {
  if (bytes < 1024)
    return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024)
    return fmt::format("{:.1f} KiB", bytes / 1024.0);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

void list(const CacheCommandOptions &options) {
  const std::filesystem::path directory = cacheDirectory(options, true);
  runtime::KernelCache cache = openCache(directory);
  std::vector<runtime::CacheEntryInfo> entries = cache.list();
  std::sort(entries.begin(), entries.end(), [](const auto &a, const auto &b) { return a.digest < b.digest; });
  fmt::print("{:<12}  {:>10}  {:<22} {:<8} {:>4}  {:<52} {}\n", "DIGEST", "SIZE", "SCHEDULE", "ARCH", "D",
             "ENTRY POINT", "STATUS");
  std::uint64_t total = 0;
  std::size_t damaged = 0;
  for (const runtime::CacheEntryInfo &entry : entries) {
    total += entry.file_bytes;
    damaged += entry.valid ? 0 : 1;
    std::optional<runtime::KernelKey> key = runtime::parseKernelKeyText(entry.key_text);
    std::string entry_point = key ? key->extra.substr(0, key->extra.find(';')) : "-";
    fmt::print("{:<12}  {:>10}  {:<22} {:<8} {:>4}  {:<52} {}\n", entry.digest.substr(0, 12),
               humanBytes(entry.file_bytes), key ? key->schedule : "-", key ? key->arch : "-",
               key ? std::to_string(key->head_dim) : "-", entry_point.empty() ? "-" : entry_point,
               entry.valid ? "ok" : "damaged: " + entry.problem);
  }
  fmt::print("{} entries ({} valid, {} damaged), {} in {}\n", entries.size(), entries.size() - damaged, damaged,
             humanBytes(total), directory.string());
}

void verify(const CacheCommandOptions &options) {
  runtime::KernelCache cache = openCache(cacheDirectory(options, true));
  runtime::CacheVerifyReport report = cache.verify(options.fix);
  std::size_t left = 0;
  for (const runtime::CacheEntryInfo &entry : report.invalid) {
    left += entry.removed ? 0 : 1;
    fmt::print("{} {}: {}\n", entry.removed ? "removed" : "damaged", entry.path.string(), entry.problem);
  }
  fmt::print("checked {} entries: {} damaged\n", report.checked, report.invalid.size());
  if (options.fix && left > 0)
    throw UserError(fmt::format("cache verify --fix: {} damaged entr{} could not be removed (see above)", left,
                                left == 1 ? "y" : "ies"));
  if (!report.invalid.empty() && !options.fix)
    throw UserError(fmt::format("cache verify: {} damaged entries (remove them with `sagegen cache verify --fix`)",
                                report.invalid.size()));
}

void clear(const CacheCommandOptions &options) {
  const std::filesystem::path directory = cacheDirectory(options, true);
  runtime::KernelCache cache = openCache(directory);
  std::size_t removed = cache.clear();
  fmt::print("removed {} entries from {}\n", removed, directory.string());
}

void warm(const CacheCommandOptions &options) {
  const PresetKernels kernels = generatePresetKernels(options.kernels, options.backward);
  std::vector<std::string> warnings;
  runtime::KernelCache cache =
      openCache(cacheDirectory(options, false), [&](const std::string &warning) { warnings.push_back(warning); });
  if (cache.directory().empty())
    throw UserError(fmt::format("--dir: cannot use it as a kernel cache: {}", warnings.empty() ? "" : warnings[0]));
  for (const runtime::GeneratedKernel &kernel : kernels.kernels) {
    double milliseconds = 0;
    const runtime::CacheResult result = runtime::cacheKernel(cache, kernel, &milliseconds);
    fmt::print("{:<6} {}  {} ({})\n", runtime::cacheSourceName(result.source), result.digest.substr(0, 12),
               kernel.entry_point,
               result.source == runtime::CacheSource::built ? fmt::format("{:.0f} ms", milliseconds) : "cached");
  }
  for (const std::string &warning : warnings)
    fmt::print(stderr, "warning: {}\n", warning);
  fmt::print("{} kernel modules of {} for {} in {}\n", kernels.kernels.size(), kernels.variant, kernels.schedule,
             cache.directory().string());
}

} // namespace

CommandAction addCacheCommand(CLI::App &app) {
  CLI::App *command = app.add_subcommand("cache", "inspect, check, clear or fill the on-disk kernel cache");
  command->require_subcommand(1);
  auto options = std::make_shared<CacheCommandOptions>();
  auto add_dir = [&](CLI::App *sub) {
    sub->add_option("--dir", options->directory,
                    "cache directory (default: $SAGEGEN_CACHE_DIR, else $XDG_CACHE_HOME/sagegen, else "
                    "~/.cache/sagegen)");
  };
  CLI::App *ls = command->add_subcommand("ls", "list the entries: digest, size, key summary, validity; totals");
  add_dir(ls);
  CLI::App *verify_command = command->add_subcommand("verify", "check every entry; exit 1 if any is damaged");
  add_dir(verify_command);
  verify_command->add_flag("--fix", options->fix, "remove the damaged entries (then exit 0)");
  CLI::App *clear_command = command->add_subcommand("clear", "delete every entry");
  add_dir(clear_command);
  CLI::App *warm_command = command->add_subcommand(
      "warm", "compile a variant's kernels into the cache with NVRTC (no GPU needed): a forward or SLA preset's, or "
              "with --backward a backward preset's");
  add_dir(warm_command);
  options->kernels.addTo(*warm_command);
  warm_command->add_flag(
      "--backward", options->backward,
      "--preset is a backward preset (sagebwd, sagebwd-int8-dp, exact-bwd): warm its SageBwd module");
  return [options, ls, verify_command, clear_command, warm_command] {
    if (ls->parsed())
      list(*options);
    else if (verify_command->parsed())
      verify(*options);
    else if (clear_command->parsed())
      clear(*options);
    else if (warm_command->parsed())
      warm(*options);
  };
}

} // namespace sage::tool
