#include "sage/codegen/DeviceLibrary.h"

#include <set>
#include <stdexcept>

namespace sage::codegen {
namespace detail {
extern const DeviceHeader kDeviceHeaders[]; // DeviceLibraryTable.cpp, generated from codegen/device
extern const unsigned kDeviceHeaderCount;
} // namespace detail

std::span<const DeviceHeader> deviceLibrary() { return {detail::kDeviceHeaders, detail::kDeviceHeaderCount}; }

const DeviceHeader *findDeviceHeader(std::string_view name) {
  for (const DeviceHeader &header : deviceLibrary())
    if (header.name == name)
      return &header;
  return nullptr;
}

namespace {

constexpr std::string_view kIncludePrefix = "#include \"sage/device/";

void expandInto(std::string &out, std::string_view text, std::set<std::string_view> &included) {
  size_t position = 0;
  while (position < text.size()) {
    size_t end = text.find('\n', position);
    end = end == std::string_view::npos ? text.size() : end + 1;
    const std::string_view line = text.substr(position, end - position);
    position = end;
    if (line.starts_with("#pragma once"))
      continue;
    if (!line.starts_with(kIncludePrefix)) {
      out += line;
      continue;
    }
    const size_t name_begin = line.find('"') + 1, name_end = line.find('"', name_begin);
    const std::string_view name = line.substr(name_begin, name_end - name_begin);
    const DeviceHeader *header = findDeviceHeader(name);
    if (!header)
      throw std::invalid_argument("device include \"" + std::string(name) + "\": not in the device library");
    if (!included.insert(header->name).second)
      continue;
    out += "// ---- begin " + std::string(header->name) + " ----\n";
    expandInto(out, header->text, included);
    out += "// ---- end " + std::string(header->name) + " ----\n";
  }
}

} // namespace

std::string expandDeviceIncludes(std::string_view source) {
  std::string out;
  std::set<std::string_view> included;
  expandInto(out, source, included);
  return out;
}

} // namespace sage::codegen
