// Byte buffers: cubins, PTX images and cache payloads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace sage::runtime {

using ByteBuffer = std::vector<std::uint8_t>;
using ByteSpan = std::span<const std::uint8_t>;

inline ByteSpan bytesOf(std::string_view text) {
  return {reinterpret_cast<const std::uint8_t *>(text.data()), text.size()};
}

} // namespace sage::runtime
