#include "sage/codegen/ScheduleKernelWriter.h"

#include "Sm80KernelWriter.h"
#include "sm120/Sm120KernelWriter.h"
#include "sm90/Sm90KernelWriter.h"

#include "sage/schedules/Sm120Schedule.h"
#include "sage/schedules/Sm80Schedule.h"
#include "sage/schedules/Sm90Schedule.h"

namespace sage::codegen {
namespace {

// A schedule's writer as its name and its write function.
class FunctionKernelWriter final : public ScheduleKernelWriter {
public:
  using Write = KernelSource (*)(const AttentionVariant &, const schedules::KernelPlan &);
  FunctionKernelWriter(std::string_view schedule, Write write) : schedule_(schedule), write_(write) {}

  std::string_view schedule() const override { return schedule_; }
  KernelSource write(const AttentionVariant &variant, const schedules::KernelPlan &plan) const override {
    return write_(variant, plan);
  }

private:
  std::string_view schedule_;
  Write write_;
};

} // namespace

const std::vector<const ScheduleKernelWriter *> &allKernelWriters() {
  // The one list: a new schedule's writer is one line here.
  static const FunctionKernelWriter sm80(schedules::Sm80Schedule::kName, writeSm80Kernel);
  static const FunctionKernelWriter sm90(schedules::Sm90Schedule::kName, writeSm90Kernel);
  static const FunctionKernelWriter sm120(schedules::Sm120Schedule::kName, writeSm120Kernel);
  static const std::vector<const ScheduleKernelWriter *> writers{&sm80, &sm90, &sm120};
  return writers;
}

const ScheduleKernelWriter *findKernelWriter(std::string_view schedule) {
  for (const ScheduleKernelWriter *writer : allKernelWriters())
    if (writer->schedule() == schedule)
      return writer;
  return nullptr;
}

} // namespace sage::codegen
