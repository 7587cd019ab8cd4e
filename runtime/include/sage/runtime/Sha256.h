// SHA-256 (FIPS 180-4), written here so cache keys and entry checksums need no external library.
// Used for stable key digests (file names on disk) and for the checksum of each disk entry.
#pragma once

#include "sage/runtime/Bytes.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace sage::runtime {

class Sha256 {
public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  Sha256 &update(ByteSpan bytes);
  Sha256 &update(std::string_view text) { return update(bytesOf(text)); }
  // Pads and returns the digest; the object must not be updated afterwards.
  Digest finish();

private:
  void compressBlock(const std::uint8_t *block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> pending_{};
  std::size_t pending_size_ = 0;
  std::uint64_t total_bytes_ = 0;
};

std::string toHex(ByteSpan bytes);
std::string sha256Hex(ByteSpan bytes);
inline std::string sha256Hex(std::string_view text) { return sha256Hex(bytesOf(text)); }

} // namespace sage::runtime
