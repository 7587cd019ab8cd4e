// The writer of sm90.wgmma_tma plans: a Config struct of the variant's constants and the instantiation of
// sage::device::sm90::attention_kernel (codegen/device/sage/device/sm90/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

// The kernel of an sm90.wgmma_tma plan, as ScheduleKernelWriter::write (registered in KernelWriterRegistry.cpp).
KernelSource writeSm90Kernel(const AttentionVariant &variant, const schedules::KernelPlan &plan);

} // namespace sage::codegen
