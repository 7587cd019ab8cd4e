// Where sagegen may write a file: a new path, or a regular file it replaces. Renaming a temporary over anything else
// would silently replace a directory entry the user did not mean (as root, a device node) or a link they set up.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace sage::runtime {

// Nothing when `path` does not exist or is a regular file (not followed if it is a symbolic link); otherwise
// "<path>: expected a regular file or a new path, found a character device" (or a directory, a FIFO, ...).
std::optional<std::string> outputPathProblem(const std::filesystem::path &path);

} // namespace sage::runtime
