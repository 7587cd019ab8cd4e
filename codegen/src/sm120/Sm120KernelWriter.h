// The writer of sm120.mma_fp4 plans: a Config struct of the variant's constants and the instantiation of
// sage::device::sm120::attention_kernel (codegen/device/sage/device/sm120/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

// The kernel of an sm120.mma_fp4 plan, as ScheduleKernelWriter::write (registered in KernelWriterRegistry.cpp).
KernelSource writeSm120Kernel(const AttentionVariant &variant, const schedules::KernelPlan &plan);

} // namespace sage::codegen
