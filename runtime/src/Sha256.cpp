// SHA-256 as specified in FIPS 180-4, section 6.2.
#include "sage/runtime/Sha256.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace sage::runtime {
namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes (FIPS 180-4, 4.2.2).
constexpr std::array<std::uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// First 32 bits of the fractional parts of the square roots of the first 8 primes (FIPS 180-4, 5.3.3).
constexpr std::array<std::uint32_t, 8> kInitialState = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

std::uint32_t loadBigEndian32(const std::uint8_t *bytes) {
  return (std::uint32_t(bytes[0]) << 24) | (std::uint32_t(bytes[1]) << 16) | (std::uint32_t(bytes[2]) << 8) |
         std::uint32_t(bytes[3]);
}

} // namespace

Sha256::Sha256() : state_(kInitialState) {}

void Sha256::compressBlock(const std::uint8_t *block) {
  // Message schedule: 16 words from the block, 48 more mixed from earlier ones.
  std::array<std::uint32_t, 64> schedule;
  for (int index = 0; index < 16; ++index)
    schedule[index] = loadBigEndian32(block + 4 * index);
  for (int index = 16; index < 64; ++index) {
    std::uint32_t previous15 = schedule[index - 15];
    std::uint32_t previous2 = schedule[index - 2];
    std::uint32_t sigma0 = std::rotr(previous15, 7) ^ std::rotr(previous15, 18) ^ (previous15 >> 3);
    std::uint32_t sigma1 = std::rotr(previous2, 17) ^ std::rotr(previous2, 19) ^ (previous2 >> 10);
    schedule[index] = schedule[index - 16] + sigma0 + schedule[index - 7] + sigma1;
  }

  std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int round = 0; round < 64; ++round) {
    std::uint32_t sum1 = std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25);
    std::uint32_t choose = (e & f) ^ (~e & g);
    std::uint32_t temp1 = h + sum1 + choose + kRoundConstants[round] + schedule[round];
    std::uint32_t sum0 = std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22);
    std::uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    std::uint32_t temp2 = sum0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + temp1;
    d = c;
    c = b;
    b = a;
    a = temp1 + temp2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

Sha256 &Sha256::update(ByteSpan bytes) {
  total_bytes_ += bytes.size();
  std::size_t offset = 0;
  if (pending_size_ > 0) {
    std::size_t take = std::min(bytes.size(), pending_.size() - pending_size_);
    std::memcpy(pending_.data() + pending_size_, bytes.data(), take);
    pending_size_ += take;
    offset = take;
    if (pending_size_ < pending_.size())
      return *this;
    compressBlock(pending_.data());
    pending_size_ = 0;
  }
  for (; offset + 64 <= bytes.size(); offset += 64)
    compressBlock(bytes.data() + offset);
  std::memcpy(pending_.data(), bytes.data() + offset, bytes.size() - offset);
  pending_size_ = bytes.size() - offset;
  return *this;
}

Sha256::Digest Sha256::finish() {
  // Padding: a 1 bit, zeros up to 56 mod 64 bytes, then the message length in bits, big-endian.
  std::uint64_t total_bits = total_bytes_ * 8;
  pending_[pending_size_++] = 0x80;
  if (pending_size_ > 56) {
    std::memset(pending_.data() + pending_size_, 0, 64 - pending_size_);
    compressBlock(pending_.data());
    pending_size_ = 0;
  }
  std::memset(pending_.data() + pending_size_, 0, 56 - pending_size_);
  for (int index = 0; index < 8; ++index)
    pending_[56 + index] = std::uint8_t(total_bits >> (56 - 8 * index));
  compressBlock(pending_.data());

  Digest digest;
  for (int word = 0; word < 8; ++word)
    for (int byte = 0; byte < 4; ++byte)
      digest[4 * word + byte] = std::uint8_t(state_[word] >> (24 - 8 * byte));
  return digest;
}

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
