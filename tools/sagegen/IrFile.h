// Reading a textual sage IR file named on the command line, the same way for every subcommand (check, explain,
// reference): only a regular file (a FIFO would block, /dev/zero never ends) of at most ir::kMaxProgramBytes.
#pragma once

#include <string>
#include <string_view>

namespace sage::tool {

// Throws std::invalid_argument "<what>: '<path>': ..." (`what`: the argument or option, "FILE" or "--ir").
std::string readIrFile(const std::string &path, std::string_view what);

} // namespace sage::tool
