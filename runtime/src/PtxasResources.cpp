// Reads ptxas's -v report. One kernel's block looks like:
//   ptxas info    : Compiling entry function 'k' for 'sm_80'
//   ptxas info    : Function properties for k
//   ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 39 registers, used 1 barriers, 256 bytes cumulative stack size, 4096 bytes smem, ...
// "Function properties" may also appear for non-inlined device functions; those lines are not the kernel's.
#include "sage/runtime/PtxasResources.h"

#include <charconv>

namespace sage::runtime {
namespace {

// The number written just before `label` in `line` ("256 bytes stack frame" -> 256), or -1.
int numberBefore(std::string_view line, std::string_view label) {
  std::size_t at = line.find(label);
  if (at == std::string_view::npos)
    return -1;
  std::size_t end = at;
  while (end > 0 && line[end - 1] == ' ')
    --end;
  std::size_t begin = end;
  while (begin > 0 && line[begin - 1] >= '0' && line[begin - 1] <= '9')
    --begin;
  int value = -1;
  if (begin == end || std::from_chars(line.data() + begin, line.data() + end, value).ec != std::errc())
    return -1;
  return value;
}

// The number written just after `label` ("Used 39 registers" with label "Used " -> 39), or -1.
int numberAfter(std::string_view line, std::string_view label) {
  std::size_t at = line.find(label);
  if (at == std::string_view::npos)
    return -1;
  int value = -1;
  const char *begin = line.data() + at + label.size();
  if (std::from_chars(begin, line.data() + line.size(), value).ec != std::errc())
    return -1;
  return value;
}

void setIfFound(int &field, int value) {
  if (value >= 0)
    field = value;
}

} // namespace

std::vector<KernelResources> parsePtxasResources(std::string_view log) {
  constexpr std::string_view kEntryPrefix = "Compiling entry function '";
  constexpr std::string_view kPropertiesPrefix = "Function properties for ";

  std::vector<KernelResources> kernels;
  bool properties_are_the_kernels = false;
  while (!log.empty()) {
    std::size_t newline = log.find('\n');
    std::string_view line = log.substr(0, newline);
    log = newline == std::string_view::npos ? std::string_view() : log.substr(newline + 1);

    if (std::size_t at = line.find(kEntryPrefix); at != std::string_view::npos) {
      std::string_view rest = line.substr(at + kEntryPrefix.size());
      kernels.push_back({.kernel = std::string(rest.substr(0, rest.find('\'')))});
      properties_are_the_kernels = false;
      continue;
    }
    if (kernels.empty())
      continue;
    KernelResources &kernel = kernels.back();
    if (std::size_t at = line.find(kPropertiesPrefix); at != std::string_view::npos) {
      properties_are_the_kernels = line.substr(at + kPropertiesPrefix.size()) == kernel.kernel;
      continue;
    }
    if (properties_are_the_kernels && line.find("bytes stack frame") != std::string_view::npos) {
      setIfFound(kernel.stack_frame_bytes, numberBefore(line, "bytes stack frame"));
      setIfFound(kernel.spill_store_bytes, numberBefore(line, "bytes spill stores"));
      setIfFound(kernel.spill_load_bytes, numberBefore(line, "bytes spill loads"));
      continue;
    }
    if (line.find("Used ") != std::string_view::npos && line.find(" registers") != std::string_view::npos) {
      setIfFound(kernel.registers, numberAfter(line, "Used "));
      setIfFound(kernel.barriers, numberAfter(line, "used "));
      setIfFound(kernel.static_shared_bytes, numberBefore(line, "bytes smem"));
    }
  }
  return kernels;
}

} // namespace sage::runtime
