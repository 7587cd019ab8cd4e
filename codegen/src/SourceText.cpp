#include "sage/codegen/SourceText.h"

namespace sage::codegen {

std::string sourceSafe(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string safe;
  safe.reserve(text.size());
  for (const char c : text) {
    const bool kept =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (kept) {
      safe.push_back(c);
    } else {
      const auto byte = static_cast<unsigned char>(c);
      safe += {'%', kHex[byte >> 4], kHex[byte & 15]};
    }
  }
  return safe;
}

} // namespace sage::codegen
