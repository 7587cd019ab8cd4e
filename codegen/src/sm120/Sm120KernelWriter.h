// The writer of sm120.mma_fp4 plans: a Config struct of the variant's constants and the instantiation of
// sage::device::sm120::attention_kernel (codegen/device/sage/device/sm120/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

class Sm120KernelWriter final : public ScheduleKernelWriter {
public:
  std::string_view schedule() const override;
  KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const override;
};

} // namespace sage::codegen
