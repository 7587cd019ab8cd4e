#include "sage/runtime/OutputPath.h"

#include <cerrno>
#include <cstring>
#include <sys/stat.h>

namespace sage::runtime {
namespace {

const char *kindOf(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISLNK(mode))
    return "a symbolic link";
  return "something other than a regular file";
}

} // namespace

std::optional<std::string> outputPathProblem(const std::filesystem::path &path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) {
    if (errno == ENOENT)
      return std::nullopt; // a new file
    return path.string() + ": cannot inspect it: " + std::strerror(errno);
  }
  if (S_ISREG(status.st_mode))
    return std::nullopt;
  return path.string() + ": expected a regular file or a new path, found " + kindOf(status.st_mode);
}

} // namespace sage::runtime
