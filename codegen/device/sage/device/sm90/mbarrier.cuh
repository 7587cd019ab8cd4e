// mbarrier wrappers (sm_90): the producer/consumer handshakes of the pipeline. A barrier lives in shared memory and
// is addressed by its 32-bit shared-window address. Phases alternate 0, 1, 0, ...: a waiter passes once the phase
// it waits on has completed.
#pragma once

namespace sage::device::sm90 {

__device__ __forceinline__ void mbarrier_init(unsigned barrier, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(barrier), "r"(arrivals) : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA) and to the other threads after a CTA barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of TMA transactions this phase must receive before it completes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned barrier, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(barrier), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(unsigned barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(barrier) : "memory");
}

// Blocks until the phase with parity `phase` has completed (try_wait suspends in hardware for a while per try).
__device__ __forceinline__ void mbarrier_wait(unsigned barrier, unsigned phase) {
  unsigned done = 0;
  do {
    asm volatile("{\n"
                 "  .reg .pred complete;\n"
                 "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
                 "  selp.u32 %0, 1, 0, complete;\n"
                 "}\n"
                 : "=r"(done)
                 : "r"(barrier), "r"(phase)
                 : "memory");
  } while (!done);
}

// The same for a thread that has nothing else to do (a producer waiting for a stage to be released): each try
// suspends the thread until the phase completes or `kSuspendNanoseconds` pass, instead of the short system default
// after which it retries, so that its retries do not take issue slots from the consumer warps of its SM sub-partition.
__device__ __forceinline__ void mbarrier_wait_suspended(unsigned barrier, unsigned phase) {
  constexpr unsigned kSuspendNanoseconds = 1000000;
  unsigned done = 0;
  do {
    asm volatile("{\n"
                 "  .reg .pred complete;\n"
                 "  mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2, %3;\n"
                 "  selp.u32 %0, 1, 0, complete;\n"
                 "}\n"
                 : "=r"(done)
                 : "r"(barrier), "r"(phase), "n"(kSuspendNanoseconds)
                 : "memory");
  } while (!done);
}

} // namespace sage::device::sm90
