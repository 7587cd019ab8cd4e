// The writer of sm80.mma_sync plans: a Config struct of the plan's and the variant's constants and the extern "C"
// entry point of sage::device::sm80::attention_kernel<Config> (sage/device/sm80/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

// The kernel of an sm80.mma_sync plan, as ScheduleKernelWriter::write (registered in KernelWriterRegistry.cpp).
KernelSource writeSm80Kernel(const AttentionVariant &variant, const schedules::KernelPlan &plan);

} // namespace sage::codegen
