// The shared tensor rules: extents without wrapping, alignment by dtype, contiguity, and the overlap rule between
// the regions of one call (fake addresses, never dereferenced).
#include "sage/runtime/TensorValidation.h"

#include "../support/RuntimeArguments.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>

using namespace sage::runtime;

namespace {

using sage::test::contiguous;

using sage::test::contains;
using sage::test::rejection;

} // namespace

TEST_CASE("extents: bytes from the pointer to the last element, refused where they wrap") {
  CHECK(extentBytes(contiguous({2, 3, 4, 8}, 0x1000), "q") == 2 * 3 * 4 * 8 * 2);
  TensorDescription strided = contiguous({2, 1, 1, 8}, 0x1000, DataType::f32);
  strided.strides[0] = 100;
  CHECK(extentBytes(strided, "q") == (100 + 8) * 4);
  // Elements past 2^63, and a span that fits 2^63 but starts so high that its end wraps past 2^64.
  TensorDescription huge = contiguous({2, 1, 1, 8}, 0x1000);
  huge.strides[0] = int64_t(1) << 62;
  CHECK(contains(rejection([&] { extentBytes(huge, "q"); }, "q"), "more than 2^63"));
  const TensorDescription high = contiguous({1, 1, 1, 64}, std::numeric_limits<uintptr_t>::max() - 64);
  CHECK(contains(rejection([&] { extentBytes(high, "k"); }, "k"), "wrap past the end of the address space"));
  CHECK(contains(rejection([&] { bufferRegion(reinterpret_cast<const void *>(0x1000), UINT64_MAX, "workspace", true); },
                           "workspace"),
                 "wrap"));
}

TEST_CASE("alignment: every tensor to its element size") {
  CHECK_NOTHROW(checkTensorBasics(contiguous({1, 1, 1, 8}, 0x1004, DataType::f32), "lse", 4, DataType::f32, 0));
  CHECK(contains(rejection(
                     [] {
                       checkTensorBasics(contiguous({1, 1, 1, 8}, 0x1002, DataType::f32), "d_k", 4, DataType::f32, 0);
                     },
                     "d_k"),
                 "data must be 4-byte aligned (f32 elements), got address 0x1002"));
  rejection(
      [] {
        checkTensorBasics(contiguous({1, 1, 1, 8}, 0x1001, DataType::bf16), "q", 4, DataType::bf16, 0);
      },
      "q");
  CHECK_NOTHROW(checkTensorBasics(contiguous({1, 1, 1, 8}, 0x1001, DataType::u8), "mask", 4, DataType::u8, 0));
  CHECK(contains(rejection(
                     [] {
                       checkAlignment(contiguous({1, 1, 1, 8}, 0x1008), "v", 16, "TMA");
                     },
                     "v"),
                 "16-byte aligned (TMA)"));
}

TEST_CASE("contiguity and shapes say what was expected and what was given") {
  TensorDescription q = contiguous({1, 2, 3, 128}, 0x1000);
  q.strides[2] = 256;
  CHECK(contains(rejection([&] { checkContiguous(q, "q"); }, "q"),
                 "q: must be contiguous: expected stride 128 (elements) in dimension 2, got 256"));
  TensorDescription ones = contiguous({1, 1, 3, 128}, 0x1000);
  ones.strides[0] = ones.strides[1] = 12345; // never stepped over
  CHECK_NOTHROW(checkContiguous(ones, "q"));
  CHECK(contains(rejection(
                     [&] {
                       checkShape(ones, "o", {1, 1, 4, 128}, "q's shape");
                     },
                     "o"),
                 "expected shape [1, 1, 4, 128] (q's shape), got [1, 1, 3, 128]"));
}

TEST_CASE("regions: written ones share no byte with any other; inputs may alias") {
  MemoryRegions regions;
  regions.add({"q", 0x1000, 0x100, false});
  regions.add({"k", 0x1000, 0x100, false}); // q = k: both read
  regions.add({"o", 0x1100, 0x100, true});  // adjacent, not overlapping
  CHECK_NOTHROW(regions.checkDisjoint());
  regions.add({"lse", 0x11ff, 4, true});
  CHECK(contains(rejection([&] { regions.checkDisjoint(); }, "lse"), "overlaps o in memory"));

  MemoryRegions outputs;
  outputs.add({"d_k", 0x1000, 0x100, true});
  outputs.add({"d_v", 0x1000, 0x100, true});
  CHECK(contains(rejection([&] { outputs.checkDisjoint(); }, "d_v"), "overlaps d_k"));

  MemoryRegions read_after;
  read_after.add({"d_q", 0x2000, 0x100, true});
  read_after.add({"q", 0x20f0, 0x100, false}); // the written one is named, whichever comes first
  CHECK(contains(rejection([&] { read_after.checkDisjoint(); }, "d_q"), "overlaps q"));

  // Regions at the very top of the address space compare without wrapping.
  MemoryRegions top;
  top.add(bufferRegion(reinterpret_cast<const void *>(UINT64_MAX - 0x1ff), 0x100, "o", true));
  top.add({"q", 0, 0x100, false});
  CHECK_NOTHROW(top.checkDisjoint());
  top.add({"k", UINT64_MAX - 0x180, 0x10, false});
  rejection([&] { top.checkDisjoint(); }, "o");
  // A region whose end would be 2^64 itself does not fit a 64-bit address.
  rejection([] { bufferRegion(reinterpret_cast<const void *>(UINT64_MAX - 0xff), 0x100, "o", true); }, "o");
}

TEST_CASE("workspace: non-null, aligned, large enough, and disjoint from the tensors") {
  MemoryRegions regions;
  regions.add({"q", 0x10000, 0x1000, false});
  regions.add({"d_q", 0x20000, 0x1000, true});
  const auto at = [](uintptr_t address) { return reinterpret_cast<const void *>(address); };
  CHECK_NOTHROW(checkWorkspace(regions, at(0x30000), 0x1000, 0x1000, 256, "sizing()"));
  CHECK(contains(rejection([&] { checkWorkspace(regions, nullptr, 0x1000, 0x1000, 256, "sizing()"); }, "workspace"),
                 "null"));
  CHECK(contains(rejection([&] { checkWorkspace(regions, at(0x30000), 0xfff, 0x1000, 256, "sizing()"); }, "workspace"),
                 "expected at least 4096 bytes (sizing()), got 4095"));
  CHECK(contains(rejection([&] { checkWorkspace(regions, at(0x30010), 0x1000, 0x1000, 256, "sizing()"); }, "workspace"),
                 "256-byte aligned"));
  CHECK(contains(rejection([&] { checkWorkspace(regions, at(0x10000), 0x1000, 0x1000, 256, "sizing()"); }, "workspace"),
                 "overlaps q"));
  CHECK(contains(rejection([&] { checkWorkspace(regions, at(0x1f100), 0x1000, 0x1000, 256, "sizing()"); }, "workspace"),
                 "overlaps d_q"));
  // Only the bytes the kernels use count: a larger buffer that reaches a tensor past them is fine.
  CHECK_NOTHROW(checkWorkspace(regions, at(0x1f000), 0x10000, 0x1000, 256, "sizing()"));
}
