// POSIX file helpers for the disk cache: whole-file reads, atomic replacement and advisory locks.
// Every failure is returned as a message (the cache turns it into a warning), never thrown.
#pragma once

#include "sage/runtime/Bytes.h"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace sage::runtime::cache_files {

enum class ReadOutcome { read, missing, failed };

struct ReadResult {
  ReadOutcome outcome = ReadOutcome::missing;
  ByteBuffer bytes;
  std::string error; // when failed
};

// The most any reader of cache entries, cubins, manifests or databases takes from one file (a cubin is a few MB).
inline constexpr std::uint64_t kMaxReadBytes = std::uint64_t(256) << 20;

// Reads a regular file of at most `max_bytes`: a FIFO, device or directory (which would block or never end) and a
// larger file are `failed` with a message, before anything is allocated for them.
ReadResult readWholeFile(const std::filesystem::path &path, std::uint64_t max_bytes = kMaxReadBytes);

// Whether `path` is a regular file whose first bytes are `prefix` (read without following a FIFO or device).
bool regularFileStartsWith(const std::filesystem::path &path, std::string_view prefix);

// Writes `bytes` to a temporary file in the same directory, fsyncs it, renames it over `path` and fsyncs the
// directory: readers see either the old file or the whole new one. Returns an error message, or nothing.
std::optional<std::string> writeFileAtomically(const std::filesystem::path &path, ByteSpan bytes);

// Creates `directory` if needed and checks a file can be created in it (as the current user: root passes
// permission bits, but not a path through a regular file or a read-only mount). Returns an error message, or nothing.
std::optional<std::string> prepareWritableDirectory(const std::filesystem::path &directory);

// An exclusive flock on `path` (created if missing), released on destruction. The lock file itself is left in
// place: deleting it would let a second process lock a new file while the first still holds the old one.
class ExclusiveFileLock {
public:
  explicit ExclusiveFileLock(const std::filesystem::path &path);
  ~ExclusiveFileLock();
  ExclusiveFileLock(const ExclusiveFileLock &) = delete;
  ExclusiveFileLock &operator=(const ExclusiveFileLock &) = delete;

  bool locked() const { return descriptor_ >= 0; }
  const std::string &error() const { return error_; } // why not locked

private:
  int descriptor_ = -1;
  std::string error_;
};

} // namespace sage::runtime::cache_files
