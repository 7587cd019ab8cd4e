// SHA-256 against the FIPS 180-4 example messages, plus chunking invariance across the padding boundaries.
#include "sage/runtime/Sha256.h"

#include <doctest/doctest.h>

#include <string>

using namespace sage::runtime;

TEST_CASE("SHA-256 of the FIPS 180-4 example messages") {
  CHECK(sha256Hex(std::string_view("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256Hex(std::string_view("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // 56 bytes: the padding needs a second block.
  CHECK(sha256Hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256Hex(std::string(1000000, 'a')) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("SHA-256 does not depend on how the message is split into updates") {
  std::string message;
  for (int index = 0; index < 300; ++index)
    message.push_back(char('a' + (index * 7) % 26));
  // Every length around the 55/56/64-byte padding boundaries, split at every chunk size up to 70.
  for (std::size_t length : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 300}) {
    std::string_view prefix(message.data(), length);
    std::string whole = sha256Hex(prefix);
    for (std::size_t chunk = 1; chunk <= 70; ++chunk) {
      Sha256 hasher;
      for (std::size_t offset = 0; offset < length; offset += chunk)
        hasher.update(prefix.substr(offset, chunk));
      Sha256::Digest digest = hasher.finish();
      INFO("length " << length << ", chunk " << chunk);
      CHECK(toHex(digest) == whole);
    }
  }
}

TEST_CASE("SHA-256 digests differ for messages that differ in one bit") {
  std::string message(100, 'x');
  std::string flipped = message;
  flipped[50] ^= 1;
  CHECK(sha256Hex(message) != sha256Hex(flipped));
  CHECK(sha256Hex(message).size() == 64);
}
