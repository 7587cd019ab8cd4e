// Group quantizers of Quantizers.h. Every step is one f32 operation in the order a kernel performs it
// (the build sets -ffp-contract=off, so nothing is fused), which makes the codes bit-exact.
#include "sage/numerics/Quantizers.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace sage::numerics {
namespace {

// max |x| over the span in f32. A NaN never wins the comparison, so it is ignored like the GPU's
// max.f32 ignores a NaN operand.
float absoluteMax(std::span<const float> values) {
  float amax = 0.0f;
  for (float value : values) {
    const float magnitude = std::fabs(value);
    if (magnitude > amax)
      amax = magnitude;
  }
  return amax;
}

void requireSameSize(size_t values, size_t codes, const char *function) {
  if (values != codes)
    throw std::invalid_argument(std::string(function) + ": codes must have as many elements as values (" +
                                std::to_string(values) + "), got " + std::to_string(codes));
}

template <typename Code, typename Round>
float quantizeSymmetric(std::span<const float> values, std::span<Code> codes, float qmax, Round round,
                        const char *function) {
  requireSameSize(values.size(), codes.size(), function);
  const SymmetricScale scale = symmetricScale(absoluteMax(values), qmax);
  for (size_t i = 0; i < values.size(); ++i)
    codes[i] = round(values[i] * scale.inverse);
  return scale.scale;
}

constexpr size_t kNvfp4GroupSize = 16;
constexpr size_t kMxfp4GroupSize = 32;
constexpr int kE2m1MaxExponent = 2; // 6 = 1.5 * 2^2
constexpr int kUe8m0Bias = 127;

void requireScaleCount(size_t values, size_t group_size, size_t scale_codes, const char *function) {
  const size_t groups = (values + group_size - 1) / group_size;
  if (scale_codes != groups)
    throw std::invalid_argument(std::string(function) + ": scale_codes must have one element per " +
                                std::to_string(group_size) + " values (" + std::to_string(groups) + "), got " +
                                std::to_string(scale_codes));
}

} // namespace

SymmetricScale symmetricScale(float amax, float qmax) {
  if (!(qmax > 0.0f) || std::isinf(qmax))
    throw std::invalid_argument("symmetricScale: qmax must be finite and positive, got " + std::to_string(qmax));
  if (!(amax >= 0.0f))
    throw std::invalid_argument("symmetricScale: amax must be >= 0 (an absolute maximum), got " + std::to_string(amax));
  if (amax == 0.0f)
    return {}; // an all-zero group: every code is 0, no division by zero
  // An infinite amax gives scale inf and inverse 0, exactly what the kernel's f32 ops give.
  return {amax / qmax, qmax / amax};
}

float quantizeInt8(std::span<const float> values, std::span<int8_t> codes) {
  return quantizeSymmetric(values, codes, 127.0f, roundToInt8, "quantizeInt8");
}

float quantizeInt4(std::span<const float> values, std::span<int8_t> codes) {
  return quantizeSymmetric(values, codes, 7.0f, roundToInt4, "quantizeInt4");
}

float quantizeE4m3(std::span<const float> values, std::span<uint8_t> codes) {
  return quantizeSymmetric(values, codes, 448.0f, floatToE4m3Bits, "quantizeE4m3");
}

float quantizeE5m2(std::span<const float> values, std::span<uint8_t> codes) {
  return quantizeSymmetric(values, codes, 57344.0f, floatToE5m2Bits, "quantizeE5m2");
}

void quantizeNvfp4Row(std::span<const float> values, float global_scale, std::span<uint8_t> codes,
                      std::span<uint8_t> scale_codes) {
  if (!(global_scale > 0.0f) || std::isinf(global_scale))
    throw std::invalid_argument("quantizeNvfp4Row: global_scale must be finite and positive, got " +
                                std::to_string(global_scale));
  requireSameSize(values.size(), codes.size(), "quantizeNvfp4Row");
  requireScaleCount(values.size(), kNvfp4GroupSize, scale_codes.size(), "quantizeNvfp4Row");
  const size_t groups = scale_codes.size();

  float scaled[kNvfp4GroupSize];
  for (size_t group = 0; group < groups; ++group) {
    const size_t begin = group * kNvfp4GroupSize;
    const size_t count = std::min(kNvfp4GroupSize, values.size() - begin);
    // 1. Divide by the global scale (f32 division), so the group's range suits a UE4M3 scale.
    for (size_t i = 0; i < count; ++i)
      scaled[i] = values[begin + i] / global_scale;
    // 2. The microscale: amax / 6 in f32, rounded to UE4M3; quantize with the rounded scale.
    const float amax = absoluteMax(std::span<const float>(scaled, count));
    scale_codes[group] = nvfp4ScaleBits(amax);
    const float scale = ue4m3BitsToFloat(scale_codes[group]);
    const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
    // 3. Codes: E2M1 of the f32 product, saturating at 6.
    for (size_t i = 0; i < count; ++i)
      codes[begin + i] = floatToE2m1Bits(scaled[i] * inverse);
  }
}

uint8_t nvfp4ScaleBits(float amax) { return floatToUe4m3Bits(amax / 6.0f); }

uint8_t mxfp4ScaleBits(float amax) {
  if (!(amax > 0.0f))
    return 0; // an all-zero group (or a NaN-only one): the smallest scale, every code 0
  if (std::isinf(amax))
    return 254;
  const int exponent = std::ilogb(amax) - kE2m1MaxExponent; // floor(log2 amax), exact also for subnormals
  return static_cast<uint8_t>(std::clamp(exponent + kUe8m0Bias, 0, 254));
}

void quantizeMxfp4Row(std::span<const float> values, std::span<uint8_t> codes, std::span<uint8_t> scale_codes) {
  requireSameSize(values.size(), codes.size(), "quantizeMxfp4Row");
  requireScaleCount(values.size(), kMxfp4GroupSize, scale_codes.size(), "quantizeMxfp4Row");
  for (size_t group = 0; group < scale_codes.size(); ++group) {
    const size_t begin = group * kMxfp4GroupSize;
    const size_t count = std::min(kMxfp4GroupSize, values.size() - begin);
    const std::span<const float> members = values.subspan(begin, count);
    scale_codes[group] = mxfp4ScaleBits(absoluteMax(members));
    // 2^-(code - 127) lies in [2^-127, 2^127]: a normal or subnormal float, so the product is a scaling by a
    // power of two, exact unless it underflows (then E2M1 rounds it to 0 anyway).
    const float inverse = std::ldexp(1.0f, kUe8m0Bias - static_cast<int>(scale_codes[group]));
    for (size_t i = 0; i < count; ++i)
      codes[begin + i] = floatToE2m1Bits(members[i] * inverse);
  }
}

} // namespace sage::numerics
