// The kernel cache: compiled images by KernelKey, in memory (per process, thread-safe) and on disk (shared by
// processes). getOrBuild() looks in memory, then on disk, and otherwise runs the builder once: across threads
// (a per-key mutex) and across processes (a per-entry flock held while building). Disk writes are atomic, so
// readers never see a partial entry. Damaged or foreign entries are reported, removed and rebuilt; a cache
// directory that cannot be used makes the cache memory-only, with one warning.
#pragma once

#include "sage/runtime/Bytes.h"
#include "sage/runtime/KernelKey.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace sage::runtime {

using CacheWarningSink = std::function<void(const std::string &warning)>;
using CacheBuilder = std::function<ByteBuffer()>;

struct KernelCacheOptions {
  std::filesystem::path directory; // empty: defaultCacheDirectory()
  bool memory_only = false;        // never touch the disk
  CacheWarningSink warning_sink;   // empty: warnings go to stderr
};

// Where a kernel image came from. KernelCache itself answers memory, disk or built; aot is the runners'
// answer for an image taken from an ahead-of-time kernel directory (AotKernelDirectory.h).
enum class CacheSource { memory, disk, built, aot };
const char *cacheSourceName(CacheSource source); // "memory", "disk", "built", "aot"

struct CacheResult {
  std::shared_ptr<const ByteBuffer> image;
  CacheSource source = CacheSource::built;
  std::string digest;
  std::vector<std::string> warnings; // those raised by this call (also sent to the sink)
};

struct CacheStats {
  std::uint64_t memory_hits = 0;
  std::uint64_t disk_hits = 0;
  std::uint64_t builds = 0;
  std::uint64_t rejected_entries = 0; // corrupt or foreign disk entries removed
  std::uint64_t write_failures = 0;
};

struct CacheEntryInfo {
  std::filesystem::path path;
  std::string digest; // from the file name
  std::string key_text;
  std::uint64_t file_bytes = 0;
  bool valid = false;
  std::string problem;  // when not valid
  bool removed = false; // by verify(true); a file without a sagegen entry header is never removed
};

struct CacheVerifyReport {
  std::size_t checked = 0;
  std::vector<CacheEntryInfo> invalid; // removed when verify(true), if sagegen wrote them (see `removed`)
};

class KernelCache {
public:
  explicit KernelCache(KernelCacheOptions options = {});

  // The image for `key`: from memory, from disk, or from `builder` (whose exceptions propagate; nothing is
  // cached then). Disk problems never throw: they become warnings and the result is still returned.
  CacheResult getOrBuild(const KernelKey &key, const CacheBuilder &builder);

  // Every entry on disk, valid or not (empty when memory-only).
  std::vector<CacheEntryInfo> list();
  // Checks every disk entry (header, sizes, checksum, and that the file name is the digest of the stored key).
  CacheVerifyReport verify(bool remove_invalid);
  // Drops the memory entries and deletes the disk entries, lock files and left-over temporary files. Returns the
  // number of disk entries deleted. Not meant to run while other processes compile into the same directory.
  std::size_t clear();

  CacheStats stats() const;
  // The directory used, or empty when the cache is memory-only (by option, or because the directory is unusable).
  std::filesystem::path directory();

  // $SAGEGEN_CACHE_DIR, else $XDG_CACHE_HOME/sagegen, else $HOME/.cache/sagegen (empty if none is set).
  static std::filesystem::path defaultCacheDirectory();

private:
  struct MemoryEntry {
    std::string key_text;
    std::shared_ptr<const ByteBuffer> image;
  };
  enum class DiskState { unchecked, usable, unusable };

  void warn(std::vector<std::string> &warnings, std::string message);
  bool diskUsable(std::vector<std::string> &warnings);
  std::filesystem::path entryPath(const std::string &digest) const;
  std::filesystem::path lockPath(const std::string &digest) const;
  CacheResult remember(const std::string &digest, const std::string &key_text, ByteBuffer image, CacheSource source,
                       std::vector<std::string> warnings);

  KernelCacheOptions options_;
  mutable std::mutex mutex_; // guards everything below
  DiskState disk_state_ = DiskState::unchecked;
  std::unordered_map<std::string, MemoryEntry> memory_;
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> building_; // one mutex per digest
  CacheStats stats_;
};

} // namespace sage::runtime
