#include "CacheFiles.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace sage::runtime::cache_files {
namespace {

std::string describeErrno(std::string_view action, const std::filesystem::path &path, int error) {
  return fmt::format("cannot {} {}: {}", action, path.string(), std::strerror(error));
}

// Closes a descriptor on scope exit.
struct Descriptor {
  int value = -1;
  ~Descriptor() {
    if (value >= 0)
      ::close(value);
  }
};

bool writeAll(int descriptor, ByteSpan bytes) {
  std::size_t written = 0;
  while (written < bytes.size()) {
    ssize_t result = ::write(descriptor, bytes.data() + written, bytes.size() - written);
    if (result < 0 && errno == EINTR)
      continue;
    if (result <= 0)
      return false;
    written += std::size_t(result);
  }
  return true;
}

} // namespace

ReadResult readWholeFile(const std::filesystem::path &path, std::uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.value < 0) {
    if (errno == ENOENT)
      return {.outcome = ReadOutcome::missing, .bytes = {}, .error = {}};
    return {.outcome = ReadOutcome::failed, .bytes = {}, .error = describeErrno("open", path, errno)};
  }
  struct stat status {};
  if (::fstat(file.value, &status) != 0)
    return {.outcome = ReadOutcome::failed, .bytes = {}, .error = describeErrno("stat", path, errno)};
  if (!S_ISREG(status.st_mode))
    return {.outcome = ReadOutcome::failed,
            .bytes = {},
            .error = fmt::format("{}: expected a regular file (not a directory, FIFO or device)", path.string())};
  if (std::uint64_t(status.st_size) > max_bytes)
    return {.outcome = ReadOutcome::failed,
            .bytes = {},
            .error = fmt::format("{}: {} bytes, more than the limit of {}", path.string(), status.st_size, max_bytes)};
  ReadResult result{.outcome = ReadOutcome::read, .bytes = {}, .error = {}};
  result.bytes.reserve(std::size_t(status.st_size));
  std::uint8_t chunk[1 << 16];
  while (true) {
    ssize_t count = ::read(file.value, chunk, sizeof(chunk));
    if (count < 0 && errno == EINTR)
      continue;
    if (count < 0)
      return {.outcome = ReadOutcome::failed, .bytes = {}, .error = describeErrno("read", path, errno)};
    if (count == 0)
      break;
    if (result.bytes.size() + std::size_t(count) > max_bytes) // it grew while being read
      return {.outcome = ReadOutcome::failed,
              .bytes = {},
              .error = fmt::format("{}: more than the limit of {} bytes", path.string(), max_bytes)};
    result.bytes.insert(result.bytes.end(), chunk, chunk + count);
  }
  return result;
}

bool regularFileStartsWith(const std::filesystem::path &path, std::string_view prefix) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  struct stat status {};
  if (file.value < 0 || ::fstat(file.value, &status) != 0 || !S_ISREG(status.st_mode))
    return false;
  std::string head(prefix.size(), '\0');
  std::size_t got = 0;
  while (got < head.size()) {
    ssize_t count = ::read(file.value, head.data() + got, head.size() - got);
    if (count < 0 && errno == EINTR)
      continue;
    if (count <= 0)
      return false;
    got += std::size_t(count);
  }
  return head == prefix;
}

std::optional<std::string> writeFileAtomically(const std::filesystem::path &path, ByteSpan bytes) {
  std::string temporary = path.string() + ".tmp.XXXXXX";
  Descriptor file{::mkstemp(temporary.data())};
  if (file.value < 0)
    return describeErrno("create a temporary file for", path, errno);
  ::fchmod(file.value, 0644); // mkstemp makes 0600; other users of a shared cache may read entries
  bool synced = writeAll(file.value, bytes) && ::fsync(file.value) == 0;
  int write_error = errno;
  if (::close(file.value) != 0 && synced) {
    synced = false;
    write_error = errno;
  }
  file.value = -1;
  if (!synced) {
    ::unlink(temporary.c_str());
    return describeErrno("write", temporary, write_error);
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    int rename_error = errno;
    ::unlink(temporary.c_str());
    return describeErrno("rename a temporary file onto", path, rename_error);
  }
  // Make the rename itself durable; a failure here loses durability, not correctness.
  Descriptor directory{::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (directory.value >= 0)
    ::fsync(directory.value);
  return std::nullopt;
}

std::optional<std::string> prepareWritableDirectory(const std::filesystem::path &directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error)
    return fmt::format("cannot create {}: {}", directory.string(), error.message());
  if (!std::filesystem::is_directory(directory, error))
    return fmt::format("{} is not a directory", directory.string());
  std::string probe = (directory / ".write-probe.XXXXXX").string();
  Descriptor file{::mkstemp(probe.data())};
  if (file.value < 0)
    return describeErrno("create a file in", directory, errno);
  ::unlink(probe.c_str());
  return std::nullopt;
}

ExclusiveFileLock::ExclusiveFileLock(const std::filesystem::path &path) {
  int descriptor = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (descriptor < 0) {
    error_ = describeErrno("open the lock file", path, errno);
    return;
  }
  int result;
  do
    result = ::flock(descriptor, LOCK_EX);
  while (result != 0 && errno == EINTR);
  if (result != 0) {
    error_ = describeErrno("lock", path, errno);
    ::close(descriptor);
    return;
  }
  descriptor_ = descriptor;
}

ExclusiveFileLock::~ExclusiveFileLock() {
  if (descriptor_ >= 0)
    ::close(descriptor_); // closing the last descriptor releases the flock
}

} // namespace sage::runtime::cache_files
