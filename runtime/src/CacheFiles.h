// POSIX file helpers for the disk cache: whole-file reads, atomic replacement and advisory locks.
// Every failure is returned as a message (the cache turns it into a warning), never thrown.
#pragma once

#include "sage/runtime/Bytes.h"

#include <filesystem>
#include <optional>
#include <string>

namespace sage::runtime::cache_files {

enum class ReadOutcome { read, missing, failed };

struct ReadResult {
  ReadOutcome outcome = ReadOutcome::missing;
  ByteBuffer bytes;
  std::string error; // when failed
};

ReadResult readWholeFile(const std::filesystem::path &path);

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
