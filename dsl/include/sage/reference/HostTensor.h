// Host tensors for the CPU reference: Q, K, V as the caller stores them (f16/bf16/f32, HND or NHD).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace sage::reference {

enum class StorageType { f16, bf16, f32 };
enum class Layout { hnd, nhd }; // [batch, heads, tokens, dim] or [batch, tokens, heads, dim]

std::string_view nameOf(StorageType type);
std::string_view nameOf(Layout layout);

// The most elements one host tensor holds (16 GiB of f32): larger shapes are refused before anything is allocated.
inline constexpr int64_t kMaxHostTensorElements = int64_t(1) << 32;

class HostTensor {
public:
  // Throws std::invalid_argument when a size is not positive or the element count exceeds kMaxHostTensorElements.
  HostTensor(int64_t batch, int64_t heads, int64_t tokens, int64_t dim, StorageType storage, Layout layout);

  int64_t batch() const { return batch_; }
  int64_t heads() const { return heads_; }
  int64_t tokens() const { return tokens_; }
  int64_t dim() const { return dim_; }
  StorageType storage() const { return storage_; }
  Layout layout() const { return layout_; }

  // Element (b, h, t, c) in logical HND order, whatever the storage layout.
  float at(int64_t b, int64_t h, int64_t t, int64_t c) const { return values_[offset(b, h, t, c)]; }
  // Stores `value` rounded to the storage type (RNE), as the caller's tensor would hold it.
  void set(int64_t b, int64_t h, int64_t t, int64_t c, double value);
  int64_t offset(int64_t b, int64_t h, int64_t t, int64_t c) const;
  const std::vector<float> &values() const { return values_; } // in storage layout, already rounded

private:
  int64_t batch_, heads_, tokens_, dim_;
  StorageType storage_;
  Layout layout_;
  std::vector<float> values_;
};

// Deterministic N(mean, stddev) data from `seed` (its own generator: identical on every platform).
// `channel_bias` > 0 adds to each channel c a bias drawn once from N(0, channel_bias) and shared by all
// tokens: the "large bias shared by all tokens" outliers the paper observes in K (section 4.2).
// `outlier_channels` = n > 0 multiplies channels k * dim / n (k < n) by `outlier_scale`, bias included: large
// channels that are not shared offsets (the Q outliers of SageAttention2; bench/accuracy_bench.py's q_outliers).
struct RandomTensorOptions {
  uint64_t seed = 0;
  double mean = 0.0;
  double stddev = 1.0;
  double channel_bias = 0.0;
  int64_t outlier_channels = 0;
  double outlier_scale = 1.0;
};

HostTensor randomTensor(int64_t batch, int64_t heads, int64_t tokens, int64_t dim, StorageType storage, Layout layout,
                        const RandomTensorOptions &options);

} // namespace sage::reference
