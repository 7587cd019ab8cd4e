#include "sage/reference/RegularFile.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <stdexcept>
#include <sys/stat.h>
#include <unistd.h>

namespace sage::reference {
namespace {

// "<what>: '<path>': <problem>", or "<what>: cannot open '<path>': <reason>".
[[noreturn]] void fail(std::string_view what, const std::string &path, const std::string &problem) {
  throw std::invalid_argument(std::string(what) + ": '" + path + "': " + problem);
}

} // namespace

RegularFile::RegularFile(const std::string &path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  descriptor_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (descriptor_ < 0)
    throw std::invalid_argument(std::string(what) + ": cannot open '" + path + "': " + std::strerror(errno));
  struct stat status {};
  if (::fstat(descriptor_, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(descriptor_);
    descriptor_ = -1;
    fail(what, path, "expected a regular file (not a directory, FIFO or device)");
  }
  size_ = static_cast<int64_t>(status.st_size);
}

RegularFile::~RegularFile() {
  if (descriptor_ >= 0)
    ::close(descriptor_);
}

bool RegularFile::read(void *buffer, int64_t count) {
  auto *bytes = static_cast<char *>(buffer);
  while (count > 0) {
    ssize_t result = ::read(descriptor_, bytes, static_cast<size_t>(count));
    if (result < 0 && errno == EINTR)
      continue;
    if (result <= 0)
      return false;
    bytes += result;
    count -= result;
    position_ += result;
  }
  return true;
}

std::string readRegularFile(const std::string &path, int64_t max_bytes, std::string_view what) {
  RegularFile file(path, what);
  if (file.size() > max_bytes)
    fail(what, path,
         "expected at most " + std::to_string(max_bytes) + " bytes, the file has " + std::to_string(file.size()));
  std::string text(static_cast<size_t>(file.size()), '\0');
  if (!file.read(text.data(), file.size()))
    fail(what, path, "could not read " + std::to_string(file.size()) + " bytes");
  return text;
}

} // namespace sage::reference
