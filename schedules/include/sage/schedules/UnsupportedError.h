// A valid request that nothing here can run (no schedule for the variant on this arch, a prologue that cannot
// quantize it). Derives from std::invalid_argument so existing catch sites keep working; the C ABI maps it to
// SAGE_UNSUPPORTED by its type, not by its message.
#pragma once

#include <stdexcept>

namespace sage::schedules {

class UnsupportedError : public std::invalid_argument {
public:
  using std::invalid_argument::invalid_argument;
};

} // namespace sage::schedules
