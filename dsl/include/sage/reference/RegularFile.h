// Reading untrusted input files: only regular files are opened (a FIFO, device or directory would block or never
// end), without blocking on open, and never more than a stated number of bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sage::reference {

class RegularFile {
public:
  // Throws std::invalid_argument "<what>: cannot open '<path>': ..." or "<what>: '<path>': ..." when `path` cannot be
  // opened or is not a regular file.
  RegularFile(const std::string &path, std::string_view what);
  ~RegularFile();
  RegularFile(const RegularFile &) = delete;
  RegularFile &operator=(const RegularFile &) = delete;

  int64_t size() const { return size_; } // from fstat at open
  int64_t remaining() const { return size_ - position_; }
  // Reads exactly `count` bytes or returns false (end of file or a read error).
  bool read(void *buffer, int64_t count);

private:
  int descriptor_ = -1;
  int64_t size_ = 0, position_ = 0;
};

// The whole of a regular file of at most `max_bytes`; throws std::invalid_argument naming `what` and the path.
std::string readRegularFile(const std::string &path, int64_t max_bytes, std::string_view what);

} // namespace sage::reference
