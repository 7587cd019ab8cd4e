// The device library: the .cuh headers under codegen/device (instruction wrappers, pipelines, the sm90 kernel
// template), embedded at build time. Generated kernels #include them by name; NVRTC receives them as headers.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace sage::codegen {

struct DeviceHeader {
  std::string_view name; // the include name, e.g. "sage/device/sm90/attention.cuh"
  std::string_view text;
};

// Every header, sorted by name.
std::span<const DeviceHeader> deviceLibrary();

// The header named `name`, or nullptr.
const DeviceHeader *findDeviceHeader(std::string_view name);

// `source` with every `#include "sage/device/..."` line replaced by that header's text (each header once, in
// include order, `#pragma once` dropped): the self-contained translation unit that `sagegen emit` writes.
// Throws std::invalid_argument naming an include the library does not have.
std::string expandDeviceIncludes(std::string_view source);

} // namespace sage::codegen
