// The writer of sm90.wgmma_tma plans: a Config struct of the variant's constants and the instantiation of
// sage::device::sm90::attention_kernel (codegen/device/sage/device/sm90/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

class Sm90KernelWriter final : public ScheduleKernelWriter {
public:
  std::string_view schedule() const override;
  KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const override;
};

} // namespace sage::codegen
