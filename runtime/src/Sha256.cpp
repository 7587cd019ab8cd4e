// SHA-256 through LLVM's implementation.
#include "sage/runtime/Sha256.h"

#include <llvm/ADT/ArrayRef.h>
#include <llvm/Support/SHA256.h>

namespace sage::runtime {

struct Sha256::State {
  llvm::SHA256 hash;
};

Sha256::Sha256() : state_(std::make_unique<State>()) {}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256 &&) noexcept = default;
Sha256 &Sha256::operator=(Sha256 &&) noexcept = default;

Sha256 &Sha256::update(ByteSpan bytes) {
  state_->hash.update(llvm::ArrayRef<std::uint8_t>(bytes.data(), bytes.size()));
  return *this;
}

Sha256::Digest Sha256::finish() { return state_->hash.final(); }

std::string toHex(ByteSpan bytes) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string text;
  text.reserve(bytes.size() * 2);
  for (std::uint8_t byte : bytes) {
    text.push_back(kDigits[byte >> 4]);
    text.push_back(kDigits[byte & 15]);
  }
  return text;
}

std::string sha256Hex(ByteSpan bytes) {
  Sha256::Digest digest = Sha256().update(bytes).finish();
  return toHex(digest);
}

} // namespace sage::runtime
