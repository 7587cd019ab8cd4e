#include "sage/runtime/KernelCache.h"

#include "CacheFiles.h"
#include "sage/runtime/CacheEntry.h"
#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

namespace sage::runtime {
namespace {

constexpr std::string_view kEntryExtension = ".kernel";
constexpr std::string_view kLockExtension = ".lock";
constexpr std::string_view kWarningPrefix = "sagegen kernel cache: ";

std::filesystem::path environmentPath(const char *name) {
  const char *value = std::getenv(name);
  return value != nullptr ? std::filesystem::path(value) : std::filesystem::path();
}

bool endsWith(const std::string &text, std::string_view suffix) { return text.ends_with(suffix); }

bool isLowerHex(std::string_view text) {
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// "<64 hex digits><suffix>": the names the cache gives its entries and locks (a user's notes.kernel is not one).
bool isDigestName(std::string_view name, std::string_view suffix) {
  return name.size() == 64 + suffix.size() && name.ends_with(suffix) && isLowerHex(name.substr(0, 64));
}

// "<prefix>XXXXXX" as mkstemp completes it.
bool isTemporaryName(std::string_view name, std::string_view prefix) {
  return name.size() == prefix.size() + 6 && name.starts_with(prefix) &&
         name.substr(prefix.size())
                 .find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") ==
             std::string_view::npos;
}

// Files this cache wrote, by name and, for entries, by their header: clear and verify --fix delete only these.
bool isOwnEntryFile(const std::filesystem::path &path) {
  return isDigestName(path.filename().string(), kEntryExtension) &&
         cache_files::regularFileStartsWith(path, kCacheEntryMagic);
}

} // namespace

const char *cacheSourceName(CacheSource source) {
  switch (source) {
  case CacheSource::memory:
    return "memory";
  case CacheSource::disk:
    return "disk";
  case CacheSource::built:
    return "built";
  case CacheSource::aot:
    return "aot";
  }
  return "unknown";
}

std::filesystem::path KernelCache::defaultCacheDirectory() {
  if (std::filesystem::path explicit_dir = environmentPath("SAGEGEN_CACHE_DIR"); !explicit_dir.empty())
    return explicit_dir;
  // The XDG spec ignores relative values.
  if (std::filesystem::path xdg = environmentPath("XDG_CACHE_HOME"); xdg.is_absolute())
    return xdg / "sagegen";
  if (std::filesystem::path home = environmentPath("HOME"); !home.empty())
    return home / ".cache" / "sagegen";
  return {};
}

KernelCache::KernelCache(KernelCacheOptions options) : options_(std::move(options)) {
  if (options_.directory.empty() && !options_.memory_only)
    options_.directory = defaultCacheDirectory();
  if (!options_.warning_sink)
    options_.warning_sink = [](const std::string &message) { std::fprintf(stderr, "warning: %s\n", message.c_str()); };
}

void KernelCache::warn(std::vector<std::string> &warnings, std::string message) {
  message.insert(0, kWarningPrefix);
  options_.warning_sink(message);
  warnings.push_back(std::move(message));
}

bool KernelCache::diskUsable(std::vector<std::string> &warnings) {
  std::string problem;
  {
    std::lock_guard lock(mutex_);
    if (disk_state_ != DiskState::unchecked)
      return disk_state_ == DiskState::usable;
    if (options_.memory_only) {
      disk_state_ = DiskState::unusable;
      return false;
    }
    if (options_.directory.empty())
      problem = "no cache directory (set SAGEGEN_CACHE_DIR, XDG_CACHE_HOME or HOME)";
    else if (std::optional<std::string> error = cache_files::prepareWritableDirectory(options_.directory))
      problem = *error;
    disk_state_ = problem.empty() ? DiskState::usable : DiskState::unusable;
  }
  if (!problem.empty())
    warn(warnings, fmt::format("{}; caching kernels in memory only", problem));
  return problem.empty();
}

std::filesystem::path KernelCache::directory() {
  std::vector<std::string> warnings;
  return diskUsable(warnings) ? options_.directory : std::filesystem::path();
}

std::filesystem::path KernelCache::entryPath(const std::string &digest) const {
  return options_.directory / (digest + std::string(kEntryExtension));
}

std::filesystem::path KernelCache::lockPath(const std::string &digest) const {
  return options_.directory / (digest + std::string(kLockExtension));
}

CacheStats KernelCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

CacheResult KernelCache::remember(const std::string &digest, const std::string &key_text, ByteBuffer image,
                                  CacheSource source, std::vector<std::string> warnings) {
  auto shared_image = std::make_shared<const ByteBuffer>(std::move(image));
  std::lock_guard lock(mutex_);
  memory_[digest] = MemoryEntry{key_text, shared_image};
  if (source == CacheSource::disk)
    ++stats_.disk_hits;
  else
    ++stats_.builds;
  return {shared_image, source, digest, std::move(warnings)};
}

CacheResult KernelCache::getOrBuild(const KernelKey &key, const CacheBuilder &builder) {
  const std::string key_text = key.text();
  const std::string digest = sha256Hex(key_text);

  // Memory first; otherwise take this key's build mutex, so threads of this process build a key once.
  auto memory_hit = [&]() -> std::optional<CacheResult> {
    auto found = memory_.find(digest);
    if (found == memory_.end() || found->second.key_text != key_text)
      return std::nullopt;
    ++stats_.memory_hits;
    return CacheResult{found->second.image, CacheSource::memory, digest, {}};
  };
  std::shared_ptr<std::mutex> key_mutex;
  {
    std::lock_guard lock(mutex_);
    if (std::optional<CacheResult> hit = memory_hit())
      return *hit;
    std::shared_ptr<std::mutex> &slot = building_[digest];
    if (!slot)
      slot = std::make_shared<std::mutex>();
    key_mutex = slot;
  }
  std::lock_guard building(*key_mutex);
  {
    std::lock_guard lock(mutex_);
    if (std::optional<CacheResult> hit = memory_hit()) // another thread built it while we waited
      return *hit;
  }

  std::vector<std::string> warnings;
  if (!diskUsable(warnings))
    return remember(digest, key_text, builder(), CacheSource::built, std::move(warnings));

  // A valid entry can be read without the lock: entries only ever appear by atomic rename.
  const std::filesystem::path path = entryPath(digest);
  cache_files::ReadResult first_read = cache_files::readWholeFile(path);
  if (first_read.outcome == cache_files::ReadOutcome::read) {
    DecodedCacheEntry entry = decodeCacheEntry(first_read.bytes, key_text);
    if (entry.status == CacheEntryStatus::valid)
      return remember(digest, key_text, std::move(entry.payload), CacheSource::disk, std::move(warnings));
  }

  // Missing or bad: lock the entry, then look again (another process may have built it meanwhile).
  cache_files::ExclusiveFileLock file_lock(lockPath(digest));
  if (!file_lock.locked())
    warn(warnings, fmt::format("{}; building without the inter-process lock", file_lock.error()));
  cache_files::ReadResult read = cache_files::readWholeFile(path);
  if (read.outcome == cache_files::ReadOutcome::failed)
    warn(warnings, read.error);
  if (read.outcome == cache_files::ReadOutcome::read) {
    DecodedCacheEntry entry = decodeCacheEntry(read.bytes, key_text);
    if (entry.status == CacheEntryStatus::valid)
      return remember(digest, key_text, std::move(entry.payload), CacheSource::disk, std::move(warnings));
    warn(warnings, fmt::format("entry {} is {} ({}); removing and rebuilding it", path.string(),
                               entry.status == CacheEntryStatus::foreign ? "foreign" : "corrupt", entry.problem));
    std::error_code remove_error;
    std::filesystem::remove(path, remove_error);
    std::lock_guard lock(mutex_);
    ++stats_.rejected_entries;
  }

  ByteBuffer image = builder();
  if (std::optional<std::string> error = cache_files::writeFileAtomically(path, encodeCacheEntry(key_text, image))) {
    warn(warnings, fmt::format("{}; the kernel stays cached in memory only", *error));
    std::lock_guard lock(mutex_);
    ++stats_.write_failures;
  }
  return remember(digest, key_text, std::move(image), CacheSource::built, std::move(warnings));
}

std::vector<CacheEntryInfo> KernelCache::list() {
  std::vector<CacheEntryInfo> entries;
  if (options_.memory_only || options_.directory.empty())
    return entries;
  std::error_code error;
  for (const auto &item : std::filesystem::directory_iterator(options_.directory, error)) {
    std::string name = item.path().filename().string();
    if (!isDigestName(name, kEntryExtension) || !item.is_regular_file(error))
      continue;
    CacheEntryInfo info;
    info.path = item.path();
    info.digest = name.substr(0, name.size() - kEntryExtension.size());
    cache_files::ReadResult read = cache_files::readWholeFile(item.path());
    if (read.outcome != cache_files::ReadOutcome::read) {
      info.problem = read.outcome == cache_files::ReadOutcome::missing ? "removed while listing" : read.error;
      entries.push_back(std::move(info));
      continue;
    }
    info.file_bytes = read.bytes.size();
    DecodedCacheEntry entry = decodeCacheEntry(read.bytes);
    info.key_text = std::move(entry.key_text);
    if (entry.status != CacheEntryStatus::valid)
      info.problem = entry.problem;
    else if (sha256Hex(info.key_text) != info.digest)
      info.problem = "foreign: the file name is not the digest of the stored key";
    info.valid = info.problem.empty();
    entries.push_back(std::move(info));
  }
  return entries;
}

CacheVerifyReport KernelCache::verify(bool remove_invalid) {
  CacheVerifyReport report;
  for (CacheEntryInfo &entry : list()) {
    ++report.checked;
    if (entry.valid)
      continue;
    if (remove_invalid) {
      if (!isOwnEntryFile(entry.path)) {
        entry.problem += " (no sagegen entry header: not written by sagegen, left in place)";
      } else {
        // Under the entry's lock, so a process that is rebuilding it is not disturbed.
        cache_files::ExclusiveFileLock file_lock(lockPath(entry.digest));
        std::error_code error;
        entry.removed = std::filesystem::remove(entry.path, error);
        if (error)
          entry.problem += fmt::format(" (could not remove: {})", error.message());
      }
    }
    report.invalid.push_back(std::move(entry));
  }
  return report;
}

std::size_t KernelCache::clear() {
  {
    std::lock_guard lock(mutex_);
    memory_.clear();
  }
  std::size_t removed_entries = 0;
  if (options_.memory_only || options_.directory.empty())
    return removed_entries;
  std::error_code error;
  std::vector<std::filesystem::path> doomed;
  for (const auto &item : std::filesystem::directory_iterator(options_.directory, error)) {
    std::string name = item.path().filename().string();
    bool ours = (isDigestName(name, kEntryExtension) && isOwnEntryFile(item.path())) ||
                isDigestName(name, kLockExtension) || isTemporaryName(name, ".write-probe.") ||
                (name.size() > 64 && isLowerHex(name.substr(0, 64)) &&
                 isTemporaryName(name.substr(64), std::string(kEntryExtension) + ".tmp."));
    if (ours && !item.is_symlink(error))
      doomed.push_back(item.path());
  }
  for (const std::filesystem::path &path : doomed) {
    std::error_code remove_error;
    if (std::filesystem::remove(path, remove_error) && endsWith(path.filename().string(), kEntryExtension))
      ++removed_entries;
  }
  return removed_entries;
}

} // namespace sage::runtime
