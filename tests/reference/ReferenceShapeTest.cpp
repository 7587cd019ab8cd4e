// Sizes the CPU reference accepts (issue 10): products of user-given dimensions are checked in 64 bits, and shapes
// whose memory or work would not finish are refused before anything is allocated.
#include "sage/reference/HostTensor.h"
#include "sage/reference/Reference.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <stdexcept>

using sage::reference::checkReferenceShape;

TEST_CASE("ordinary shapes pass") {
  CHECK_NOTHROW(checkReferenceShape(1, 2, 2, 1024, 1024, 128));
  CHECK_NOTHROW(checkReferenceShape(4, 32, 8, 4096, 4096, 64)); // 2^36 multiply-adds
}

TEST_CASE("memory past the limit is refused with the estimate") {
  // reference --n 16777216 --batch 65535 --heads 4096: the input alone is 2^79 bytes.
  CHECK_THROWS_WITH_AS(checkReferenceShape(65535, 4096, 1, 16777216, 16777216, 128),
                       doctest::Contains("more than 2^63 bytes of memory"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(checkReferenceShape(1, 64, 64, 1 << 20, 1 << 20, 128), doctest::Contains("the limit is 16 GiB"),
                       std::invalid_argument);
}

TEST_CASE("work past the limit is refused") {
  // The issue's --n 144115188075855872: the product of sizes overflows 64 bits.
  CHECK_THROWS_WITH_AS(checkReferenceShape(1, 1, 1, int64_t(1) << 57, int64_t(1) << 57, 128),
                       doctest::Contains("the CPU reference would"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(checkReferenceShape(1, 1, 1, 1000000, 1000000, 128), doctest::Contains("the limit is 2^38"),
                       std::invalid_argument);
}

TEST_CASE("a host tensor whose element count overflows is refused, not allocated") {
  using sage::reference::HostTensor;
  using sage::reference::Layout;
  using sage::reference::StorageType;
  CHECK_THROWS_WITH_AS(HostTensor(1, int64_t(1) << 32, int64_t(1) << 32, 16, StorageType::f32, Layout::hnd),
                       doctest::Contains("exceeds the limit of 4294967296"), std::invalid_argument);
  CHECK_THROWS_AS(HostTensor(1, 1, int64_t(1) << 57, 128, StorageType::f16, Layout::nhd), std::invalid_argument);
  CHECK_THROWS_AS(HostTensor(1, -1, 4, 16, StorageType::f16, Layout::hnd), std::invalid_argument);
}
