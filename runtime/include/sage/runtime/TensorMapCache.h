// The last TMA tensor map encoded per slot, by everything it was encoded from. A tensor map is a pure function of
// its request (address, sizes, strides, box, swizzle), so a repeated call (the same workspace, the same V) copies
// 128 bytes instead of calling cuTensorMapEncodeTiled again: the host time per call (issue 24).
#pragma once

#include "sage/runtime/CudaDriver.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace sage::runtime {

// What cuTensorMapEncodeTiled takes (CudaDriver::encodeTensorMap): `rank` dims innermost first, the byte strides of
// dims 1.., the box. Unused entries stay zero, so that two requests compare equal exactly when they encode alike.
struct TensorMapRequest {
  static constexpr unsigned kMaxRank = 5;
  unsigned rank = 0;
  const void *address = nullptr;
  std::array<std::uint64_t, kMaxRank> dims{};
  std::array<std::uint64_t, kMaxRank - 1> strides{};
  std::array<unsigned, kMaxRank> box{};
  driver::TensorMapSwizzle swizzle = driver::TensorMapSwizzle::none;

  bool operator==(const TensorMapRequest &) const = default;
};

class TensorMapCache {
public:
  static constexpr std::size_t kSlots = 3; // an sm90 call's Q, K and V maps

  // `map` for `request` in `slot`: the slot's last map when it was made from the same request, else
  // `encode(request, map)` (which may throw; the slot then keeps nothing). Thread-safe.
  template <class Encode>
  void get(std::size_t slot, const TensorMapRequest &request, driver::TensorMap &map, Encode &&encode) {
    std::lock_guard lock(mutex_);
    Entry &entry = entries_.at(slot);
    if (entry.valid && entry.request == request) {
      map = entry.map;
      return;
    }
    entry.valid = false;
    encode(request, map);
    entry.request = request;
    entry.map = map;
    entry.valid = true;
  }

private:
  struct Entry {
    TensorMapRequest request;
    driver::TensorMap map{};
    bool valid = false;
  };
  std::mutex mutex_;
  std::array<Entry, kSlots> entries_{};
};

} // namespace sage::runtime
