#include "sage/runtime/CacheEntry.h"

#include "sage/runtime/KernelKey.h"
#include "sage/runtime/Sha256.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace sage::runtime {
namespace {

constexpr std::size_t kVersionOffset = 8;
constexpr std::size_t kKeySizeOffset = 12;
constexpr std::size_t kPayloadSizeOffset = 16;
constexpr std::size_t kChecksumOffset = 24;
constexpr std::size_t kChecksumBytes = 32;
static_assert(kChecksumOffset + kChecksumBytes == kCacheEntryHeaderBytes);

// Keys are a few hundred bytes; anything far larger is a damaged size field, not a key.
constexpr std::uint32_t kMaxKeyTextBytes = 1u << 20;

void storeLittleEndian(std::uint8_t *destination, std::uint64_t value, int bytes) {
  for (int index = 0; index < bytes; ++index)
    destination[index] = std::uint8_t(value >> (8 * index));
}

std::uint64_t loadLittleEndian(const std::uint8_t *source, int bytes) {
  std::uint64_t value = 0;
  for (int index = 0; index < bytes; ++index)
    value |= std::uint64_t(source[index]) << (8 * index);
  return value;
}

Sha256::Digest entryChecksum(ByteSpan key_text, ByteSpan payload) {
  return Sha256().update(key_text).update(payload).finish();
}

DecodedCacheEntry corrupt(std::string problem) {
  return {.status = CacheEntryStatus::corrupt, .problem = std::move(problem), .key_text = {}, .payload = {}};
}

} // namespace

ByteBuffer encodeCacheEntry(std::string_view key_text, ByteSpan payload) {
  ByteBuffer file(kCacheEntryHeaderBytes + key_text.size() + payload.size());
  std::memcpy(file.data(), kCacheEntryMagic.data(), kCacheEntryMagic.size());
  storeLittleEndian(file.data() + kVersionOffset, kKernelKeyFormatVersion, 4);
  storeLittleEndian(file.data() + kKeySizeOffset, key_text.size(), 4);
  storeLittleEndian(file.data() + kPayloadSizeOffset, payload.size(), 8);
  Sha256::Digest checksum = entryChecksum(bytesOf(key_text), payload);
  std::copy(checksum.begin(), checksum.end(), file.begin() + kChecksumOffset);
  std::copy(key_text.begin(), key_text.end(), file.begin() + kCacheEntryHeaderBytes);
  std::copy(payload.begin(), payload.end(), file.begin() + kCacheEntryHeaderBytes + key_text.size());
  return file;
}

DecodedCacheEntry decodeCacheEntry(ByteSpan file, std::string_view expected_key_text) {
  if (file.size() < kCacheEntryHeaderBytes)
    return corrupt(
        fmt::format("truncated: {} bytes, shorter than the {}-byte header", file.size(), kCacheEntryHeaderBytes));
  if (!std::equal(kCacheEntryMagic.begin(), kCacheEntryMagic.end(), file.begin()))
    return corrupt("bad magic: not a sagegen kernel cache entry");
  std::uint64_t version = loadLittleEndian(file.data() + kVersionOffset, 4);
  if (version != kKernelKeyFormatVersion)
    return corrupt(fmt::format("format version {}, expected {}", version, kKernelKeyFormatVersion));
  std::uint64_t key_size = loadLittleEndian(file.data() + kKeySizeOffset, 4);
  std::uint64_t payload_size = loadLittleEndian(file.data() + kPayloadSizeOffset, 8);
  if (key_size > kMaxKeyTextBytes)
    return corrupt(fmt::format("key size {} is not plausible", key_size));
  std::uint64_t body_size = file.size() - kCacheEntryHeaderBytes;
  if (payload_size > body_size || key_size + payload_size != body_size)
    return corrupt(fmt::format("size mismatch: the header announces {} key + {} payload bytes, the file holds {}",
                               key_size, payload_size, body_size));

  ByteSpan key_bytes = file.subspan(kCacheEntryHeaderBytes, key_size);
  ByteSpan payload = file.subspan(kCacheEntryHeaderBytes + key_size);
  Sha256::Digest checksum = entryChecksum(key_bytes, payload);
  if (!std::equal(checksum.begin(), checksum.end(), file.begin() + kChecksumOffset))
    return corrupt("checksum mismatch: the key text or payload was damaged");

  std::string key_text(key_bytes.begin(), key_bytes.end());
  if (!expected_key_text.empty() && key_text != expected_key_text)
    return {.status = CacheEntryStatus::foreign,
            .problem = "stored for another key (a digest collision or another key format)",
            .key_text = std::move(key_text),
            .payload = {}};
  return {.status = CacheEntryStatus::valid,
          .problem = {},
          .key_text = std::move(key_text),
          .payload = ByteBuffer(payload.begin(), payload.end())};
}

} // namespace sage::runtime
