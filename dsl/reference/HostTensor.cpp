#include "sage/reference/HostTensor.h"

#include "sage/numerics/CheckedSize.h"
#include "sage/numerics/Quantizers.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace sage::reference {

std::string_view nameOf(StorageType type) {
  switch (type) {
  case StorageType::f16:
    return "f16";
  case StorageType::bf16:
    return "bf16";
  case StorageType::f32:
    return "f32";
  }
  return "<invalid>";
}

std::string_view nameOf(Layout layout) { return layout == Layout::hnd ? "HND" : "NHD"; }

HostTensor::HostTensor(int64_t batch, int64_t heads, int64_t tokens, int64_t dim, StorageType storage, Layout layout)
    : batch_(batch), heads_(heads), tokens_(tokens), dim_(dim), storage_(storage), layout_(layout) {
  if (batch <= 0 || heads <= 0 || tokens <= 0 || dim <= 0)
    throw std::invalid_argument("HostTensor: batch, heads, tokens and dim must be positive, got [" +
                                std::to_string(batch) + ", " + std::to_string(heads) + ", " + std::to_string(tokens) +
                                ", " + std::to_string(dim) + "]");
  const int64_t count = numerics::productAtMost({batch, heads, tokens, dim}, kMaxHostTensorElements,
                                                "HostTensor: elements of [batch, heads, tokens, dim]");
  values_.assign(static_cast<size_t>(count), 0.0f);
}

int64_t HostTensor::offset(int64_t b, int64_t h, int64_t t, int64_t c) const {
  if (layout_ == Layout::hnd)
    return ((b * heads_ + h) * tokens_ + t) * dim_ + c;
  return ((b * tokens_ + t) * heads_ + h) * dim_ + c;
}

void HostTensor::set(int64_t b, int64_t h, int64_t t, int64_t c, double value) {
  float stored = static_cast<float>(value);
  if (storage_ == StorageType::f16)
    stored = numerics::roundToHalf(value);
  else if (storage_ == StorageType::bf16)
    stored = numerics::roundToBfloat16(value);
  values_[offset(b, h, t, c)] = stored;
}

namespace {

// SplitMix64: a tiny, well-mixed generator whose sequence is the same on every platform.
class SplitMix64 {
public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; } // in (0, 1)
  double normal() {                                                                  // Box-Muller
    constexpr double kTwoPi = 6.283185307179586476925;
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(kTwoPi * uniform());
  }

private:
  uint64_t state_;
};

} // namespace

HostTensor randomTensor(int64_t batch, int64_t heads, int64_t tokens, int64_t dim, StorageType storage, Layout layout,
                        const RandomTensorOptions &options) {
  HostTensor tensor(batch, heads, tokens, dim, storage, layout);
  SplitMix64 generator(options.seed);
  std::vector<double> bias(static_cast<size_t>(dim), 0.0);
  if (options.channel_bias > 0.0)
    for (double &value : bias)
      value = generator.normal() * options.channel_bias;
  std::vector<double> factor(static_cast<size_t>(dim), 1.0);
  for (int64_t k = 0; k < std::min(options.outlier_channels, dim); ++k)
    factor[static_cast<size_t>(k * dim / std::min(options.outlier_channels, dim))] = options.outlier_scale;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t c = 0; c < dim; ++c)
          tensor.set(b, h, t, c, (options.mean + options.stddev * generator.normal() + bias[c]) * factor[c]);
  return tensor;
}

} // namespace sage::reference
