// The disk entry format: round trip, and every kind of damage is told apart from a foreign entry.
#include "sage/runtime/CacheEntry.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage::runtime;

namespace {

ByteBuffer samplePayload() {
  ByteBuffer payload;
  for (int index = 0; index < 200; ++index)
    payload.push_back(std::uint8_t(index * 37 + 11));
  return payload;
}

const std::string kKeyText = "sagegen-kernel-key 1\narch=sm_90a\n";

} // namespace

TEST_CASE("an encoded entry decodes to its key text and payload") {
  ByteBuffer payload = samplePayload();
  ByteBuffer file = encodeCacheEntry(kKeyText, payload);
  CHECK(file.size() == kCacheEntryHeaderBytes + kKeyText.size() + payload.size());

  DecodedCacheEntry entry = decodeCacheEntry(file, kKeyText);
  CHECK(entry.status == CacheEntryStatus::valid);
  CHECK(entry.problem.empty());
  CHECK(entry.key_text == kKeyText);
  CHECK(entry.payload == payload);

  // Without an expected key, any intact entry is valid.
  CHECK(decodeCacheEntry(file).status == CacheEntryStatus::valid);
}

TEST_CASE("an empty payload is a valid entry") {
  ByteBuffer file = encodeCacheEntry(kKeyText, {});
  DecodedCacheEntry entry = decodeCacheEntry(file, kKeyText);
  CHECK(entry.status == CacheEntryStatus::valid);
  CHECK(entry.payload.empty());
}

TEST_CASE("flipping any single byte makes the entry corrupt") {
  ByteBuffer file = encodeCacheEntry(kKeyText, samplePayload());
  for (std::size_t position = 0; position < file.size(); ++position) {
    ByteBuffer damaged = file;
    damaged[position] ^= 0x40;
    DecodedCacheEntry entry = decodeCacheEntry(damaged, kKeyText);
    INFO("flipped byte " << position);
    CHECK(entry.status == CacheEntryStatus::corrupt);
    CHECK(!entry.problem.empty());
    CHECK(entry.payload.empty());
  }
}

TEST_CASE("every truncation, and trailing bytes, make the entry corrupt") {
  ByteBuffer file = encodeCacheEntry(kKeyText, samplePayload());
  for (std::size_t length = 0; length < file.size(); ++length) {
    ByteBuffer truncated(file.begin(), file.begin() + std::ptrdiff_t(length));
    INFO("length " << length);
    CHECK(decodeCacheEntry(truncated, kKeyText).status == CacheEntryStatus::corrupt);
  }
  ByteBuffer longer = file;
  longer.push_back(0);
  DecodedCacheEntry entry = decodeCacheEntry(longer, kKeyText);
  CHECK(entry.status == CacheEntryStatus::corrupt);
  CHECK(entry.problem.find("size mismatch") != std::string::npos);
}

TEST_CASE("damage is described: magic, truncation, checksum") {
  ByteBuffer file = encodeCacheEntry(kKeyText, samplePayload());
  ByteBuffer bad_magic = file;
  bad_magic[0] = 'X';
  CHECK(decodeCacheEntry(bad_magic).problem.find("magic") != std::string::npos);
  ByteBuffer header_only(file.begin(), file.begin() + 10);
  CHECK(decodeCacheEntry(header_only).problem.find("truncated") != std::string::npos);
  ByteBuffer bad_payload = file;
  bad_payload[kCacheEntryHeaderBytes + kKeyText.size() + 5] ^= 1; // a payload byte
  CHECK(decodeCacheEntry(bad_payload).problem.find("checksum") != std::string::npos);
}

TEST_CASE("an intact entry stored for another key is foreign, not corrupt") {
  ByteBuffer file = encodeCacheEntry(kKeyText, samplePayload());
  DecodedCacheEntry entry = decodeCacheEntry(file, "sagegen-kernel-key 1\narch=sm_80\n");
  CHECK(entry.status == CacheEntryStatus::foreign);
  CHECK(entry.key_text == kKeyText);
  CHECK(entry.payload.empty());
}
