// The on-disk form of one kernel cache entry: a fixed header, the key's full text, then the payload (a cubin).
//
//   offset  size  field
//        0     8  magic "SAGEKERN"
//        8     4  format version (kKernelKeyFormatVersion), little-endian
//       12     4  key text size in bytes, little-endian
//       16     8  payload size in bytes, little-endian
//       24    32  SHA-256 of the key text followed by the payload
//       56     -  key text, then payload; the file ends exactly there
//
// Decoding tells a corrupt entry (bad magic or version, truncated, trailing bytes, checksum mismatch) from a
// foreign one (intact, but stored for another key: a digest collision or a different key format).
#pragma once

#include "sage/runtime/Bytes.h"

#include <string>
#include <string_view>

namespace sage::runtime {

inline constexpr std::string_view kCacheEntryMagic = "SAGEKERN";
inline constexpr std::size_t kCacheEntryHeaderBytes = 56;

ByteBuffer encodeCacheEntry(std::string_view key_text, ByteSpan payload);

enum class CacheEntryStatus { valid, corrupt, foreign };

struct DecodedCacheEntry {
  CacheEntryStatus status = CacheEntryStatus::corrupt;
  std::string problem; // what is wrong, when not valid
  std::string key_text;
  ByteBuffer payload; // filled only when valid
};

// `expected_key_text` empty: accept any key (used by verify/list, which check the digest instead).
DecodedCacheEntry decodeCacheEntry(ByteSpan file, std::string_view expected_key_text = {});

} // namespace sage::runtime
