// Reading Q/K/V samples from NumPy .npy files (format 1.0-3.0, little-endian <f2 or <f4, C order,
// 4-D [batch, heads, tokens, dim] or 3-D [heads, tokens, dim]): the documented input of `sagegen select`.
#pragma once

#include "sage/reference/HostTensor.h"

#include <string>

namespace sage::reference {

// Throws std::invalid_argument naming the file and what was expected.
HostTensor loadNpyTensor(const std::string &path);

} // namespace sage::reference
