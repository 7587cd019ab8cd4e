// cp.async: asynchronous global -> shared copies, grouped and waited on by the multi-stage pipeline.
#include "sage/codegen/PtxEmitters.h"

namespace sage::codegen {

std::string emitCpAsyncCopy16Function() {
  return R"(// 16 bytes global -> shared, bypassing L1 (cp.async.cg); when !fill nothing is read and the bytes become 0
__device__ __forceinline__ void cp_async_16(unsigned shared_address, const void *global_address, bool fill) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global_address),
               "r"(fill ? 16 : 0));
}
)";
}

std::string emitCpAsyncCopy4Function() {
  return R"(// 4 bytes global -> shared (cp.async.ca: sizes below 16 bytes go through L1)
__device__ __forceinline__ void cp_async_4(unsigned shared_address, const void *global_address) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address), "l"(global_address));
}
)";
}

std::string emitCpAsyncCommitFunction() {
  return R"(// Closes the group of cp.async copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
)";
}

std::string emitCpAsyncWaitFunction() {
  return R"(// Waits until at most kPending committed groups are still in flight
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
)";
}

} // namespace sage::codegen
