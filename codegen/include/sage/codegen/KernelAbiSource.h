// The text of sage/codegen/KernelAbi.h, embedded at build time: every generated kernel pastes it, so host and
// device agree on SageAttentionParams / SagePrologueParams by construction.
#pragma once

#include <string_view>

namespace sage::codegen {

std::string_view kernelAbiSource();

} // namespace sage::codegen
