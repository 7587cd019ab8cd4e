// The writer of sm80.mma_sync plans: the detail::emit* pipeline of src/Kernel*.cpp (KernelText.h).
#pragma once

#include "sage/codegen/ScheduleKernelWriter.h"

namespace sage::codegen {

class Sm80KernelWriter final : public ScheduleKernelWriter {
public:
  std::string_view schedule() const override;
  KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const override;
};

} // namespace sage::codegen
