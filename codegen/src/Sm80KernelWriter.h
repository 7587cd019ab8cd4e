// The writer of sm80.mma_sync plans: a Config struct of the plan's and the variant's constants and the extern "C"
// entry point of sage::device::sm80::attention_kernel<Config> (sage/device/sm80/attention.cuh).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

class Sm80KernelWriter final : public ScheduleKernelWriter {
public:
  std::string_view schedule() const override;
  KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const override;
};

} // namespace sage::codegen
