// The randomized Hadamard rotation of Q and K along the head dim (issue 28), defined bit for bit so that the CPU
// reference and the quantization prologue produce the same f32 values, hence the same codes.
//
// Why: an outlier channel of Q (or K) sets the scale of every int8/fp8 group it lies in, and K smoothing cannot
// remove it when its mean is zero. A rotation spreads each channel over all d channels; the scores are unchanged
// because the rotations of Q and K cancel: (Q R_Q)(K R_K)^T = Q K^T (FlashAttention-3's "incoherent processing").
//
// The rotation of one token x (a row of d = 2^n f32 values, d in [16, 256]):
//   1. x <- x H, the Sylvester-Hadamard matrix (entries +-1), as a fast Walsh-Hadamard transform in f32: n stages,
//      stride h = 1, 2, 4, ..., d / 2 in that order; in a stage every pair (c, c + h) with bit h of c clear becomes
//      (x[c] + x[c + h], x[c] - x[c + h]), one f32 rounding each. (The prologue does strides 1, 2, 4 inside a thread's
//      8 channels and 8, 16, ... across lanes with __shfl_xor_sync; the lane holding c + h computes the same
//      x[c] - x[c + h].)
//   2. x[c] <- x[c] * m[c], m[c] = -2^-e if bit c of hadamardSigns(seed) is set, else +2^-e: the random signs D and
//      the normalisation in one f32 multiply, exact (a power of two) unless the result is subnormal.
// The normalisation is split between Q and K so that both multiplies are exact: e = floor(n / 2) for Q and
// ceil(n / 2) for K, so R_Q = H D 2^-floor(n/2), R_K = H D 2^-ceil(n/2) and R_Q R_K^T = H D D H / d = I. For d = 64
// both are the orthonormal H D / 8; for d = 128, Q gets H D / 8 and K gets H D / 16 instead of H D / sqrt(128)
// each: the same rotation up to a power of two, which every symmetric quantizer carries exactly in its scale.
// The rotation comes after smoothing (K - mean(K), Q - mean of its block): both are linear, so the order does not
// change the exact result, and this order keeps the means (and the column statistics they come from) those of the
// unrotated tokens, so the prologue rotates each token once, in registers, right before quantizing it.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>

namespace sage::numerics {

inline constexpr int kMinHadamardDim = 16;
inline constexpr int kMaxHadamardDim = 256;

inline constexpr bool isHadamardDim(int64_t d) {
  return d >= kMinHadamardDim && d <= kMaxHadamardDim && std::has_single_bit(static_cast<uint64_t>(d));
}

// The sign bits D: bit c (of word c / 64) set means channel c is negated. Words are SplitMix64's outputs from state
// `seed` (Steele, Lea and Flood 2014), a fixed, portable generator.
inline constexpr std::array<uint64_t, kMaxHadamardDim / 64> hadamardSigns(uint32_t seed) {
  std::array<uint64_t, kMaxHadamardDim / 64> words{};
  uint64_t state = seed;
  for (uint64_t &word : words) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    word = z ^ (z >> 31);
  }
  return words;
}

inline constexpr bool hadamardNegates(uint32_t seed, int channel) {
  return (hadamardSigns(seed)[channel / 64] >> (channel % 64) & 1u) != 0;
}

// The power of two e of step 2 for Q (`for_k` false) or K.
inline constexpr int hadamardScaleExponent(int d, bool for_k) {
  const int n = std::countr_zero(static_cast<unsigned>(d));
  return for_k ? (n + 1) / 2 : n / 2;
}

// Rotates one token in place, exactly as the header comment says.
inline void hadamardRotate(std::span<float> x, uint32_t seed, bool for_k) {
  const int d = static_cast<int>(x.size());
  if (!isHadamardDim(d))
    throw std::invalid_argument("hadamardRotate: the head dim must be a power of two in [16, 256]");
  for (int h = 1; h < d; h *= 2)
    for (int c = 0; c < d; ++c)
      if ((c & h) == 0) {
        const float a = x[c], b = x[c + h];
        x[c] = a + b;
        x[c + h] = a - b;
      }
  const float magnitude = std::ldexp(1.0f, -hadamardScaleExponent(d, for_k));
  const auto signs = hadamardSigns(seed);
  for (int c = 0; c < d; ++c)
    x[c] = x[c] * ((signs[c / 64] >> (c % 64) & 1u) != 0 ? -magnitude : magnitude);
}

} // namespace sage::numerics
