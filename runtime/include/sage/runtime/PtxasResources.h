// Per-kernel resource usage as ptxas reports it with -v (NVRTC returns that report in its log): registers,
// stack frame, spills, static shared memory. Read from the log rather than from the cubin's ELF notes because
// the log is the documented form, works for every arch and is the only one that counts spills.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace sage::runtime {

struct KernelResources {
  std::string kernel; // the entry point's (lowered) name
  int registers = 0;
  int barriers = 0;
  int stack_frame_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int static_shared_bytes = 0;
};

// One entry per "Compiling entry function" block of the log, in order; lines it does not know are skipped.
std::vector<KernelResources> parsePtxasResources(std::string_view log);

} // namespace sage::runtime
