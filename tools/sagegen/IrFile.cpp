#include "IrFile.h"

#include "sage/ir/Program.h"
#include "sage/reference/RegularFile.h"

namespace sage::tool {

std::string readIrFile(const std::string &path, std::string_view what) {
  return reference::readRegularFile(path, int64_t(ir::kMaxProgramBytes), what);
}

} // namespace sage::tool
