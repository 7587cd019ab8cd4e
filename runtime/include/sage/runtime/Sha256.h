// SHA-256 for stable key digests (file names on disk) and the checksum of each disk entry: LLVM's
// (llvm/Support/SHA256.h) behind sagegen's interface, so this header needs no LLVM.
#pragma once

#include "sage/runtime/Bytes.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace sage::runtime {

class Sha256 {
public:
  using Digest = std::array<std::uint8_t, 32>;

  Sha256();
  ~Sha256();
  Sha256(Sha256 &&) noexcept;
  Sha256 &operator=(Sha256 &&) noexcept;
  Sha256 &update(ByteSpan bytes);
  Sha256 &update(std::string_view text) { return update(bytesOf(text)); }
  // Pads and returns the digest; the object must not be updated afterwards.
  Digest finish();

private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string toHex(ByteSpan bytes);
std::string sha256Hex(ByteSpan bytes);
inline std::string sha256Hex(std::string_view text) { return sha256Hex(bytesOf(text)); }

} // namespace sage::runtime
