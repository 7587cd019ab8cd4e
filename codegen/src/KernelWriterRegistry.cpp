#include "sage/codegen/ScheduleKernelWriter.h"

#include "Sm80KernelWriter.h"
#include "sm120/Sm120KernelWriter.h"
#include "sm90/Sm90KernelWriter.h"

namespace sage::codegen {

const std::vector<const ScheduleKernelWriter *> &allKernelWriters() {
  // The one list: a new schedule's writer is one line here.
  static const Sm80KernelWriter sm80;
  static const Sm90KernelWriter sm90;
  static const Sm120KernelWriter sm120;
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
