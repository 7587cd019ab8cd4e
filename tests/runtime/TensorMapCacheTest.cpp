// The sm90 tensor maps kept between calls (TensorMapCache): a map is encoded again exactly when anything it is made
// from changes; a failed encode leaves nothing behind. The encoder is a counting stand-in (no driver needed).
#include "sage/runtime/TensorMapCache.h"

#include <doctest/doctest.h>

#include <stdexcept>

using namespace sage::runtime;

namespace {

TensorMapRequest rows(const void *address, std::uint64_t rows_count) {
  TensorMapRequest request;
  request.rank = 2;
  request.address = address;
  request.dims = {128, rows_count, 0, 0, 0};
  request.strides = {128, 0, 0, 0};
  request.box = {128, 64, 0, 0, 0};
  request.swizzle = driver::TensorMapSwizzle::bytes128;
  return request;
}

// Writes the request's address and first dim into the map, so that a copy can be told from a fresh encode.
struct CountingEncoder {
  int calls = 0;
  void operator()(const TensorMapRequest &request, driver::TensorMap &map) {
    ++calls;
    map = {};
    map.opaque[0] = reinterpret_cast<std::uintptr_t>(request.address);
    map.opaque[1] = request.dims[1];
    map.opaque[2] = static_cast<unsigned long long>(calls);
  }
};

} // namespace

TEST_CASE("a repeated request is served from its slot; any change encodes again") {
  TensorMapCache cache;
  CountingEncoder encoder;
  auto encode = [&](const TensorMapRequest &request, driver::TensorMap &map) { encoder(request, map); };
  alignas(16) static unsigned char workspace[256];
  driver::TensorMap map{};

  cache.get(0, rows(workspace, 256), map, encode);
  CHECK(encoder.calls == 1);
  cache.get(0, rows(workspace, 256), map, encode);
  CHECK(encoder.calls == 1);
  CHECK(map.opaque[0] == reinterpret_cast<std::uintptr_t>(workspace));
  CHECK(map.opaque[2] == 1); // the first encode's map, copied

  cache.get(0, rows(workspace + 16, 256), map, encode); // another address
  CHECK(encoder.calls == 2);
  cache.get(0, rows(workspace + 16, 512), map, encode); // another size
  CHECK(encoder.calls == 3);
  CHECK(map.opaque[1] == 512);
  TensorMapRequest swizzled = rows(workspace + 16, 512);
  swizzled.swizzle = driver::TensorMapSwizzle::bytes64;
  cache.get(0, swizzled, map, encode);
  CHECK(encoder.calls == 4);
  TensorMapRequest boxed = swizzled;
  boxed.box[1] = 128;
  cache.get(0, boxed, map, encode);
  CHECK(encoder.calls == 5);
  TensorMapRequest strided = boxed;
  strided.strides[0] = 256;
  cache.get(0, strided, map, encode);
  CHECK(encoder.calls == 6);

  // Slots are independent: Q's map does not evict K's or V's.
  cache.get(1, rows(workspace, 64), map, encode);
  cache.get(2, rows(workspace, 32), map, encode);
  CHECK(encoder.calls == 8);
  cache.get(0, strided, map, encode);
  cache.get(1, rows(workspace, 64), map, encode);
  cache.get(2, rows(workspace, 32), map, encode);
  CHECK(encoder.calls == 8);
  CHECK(map.opaque[1] == 32);
  CHECK_THROWS_AS(cache.get(TensorMapCache::kSlots, rows(workspace, 32), map, encode), std::out_of_range);
}

TEST_CASE("a failed encode keeps no map: the next request encodes again") {
  TensorMapCache cache;
  alignas(16) static unsigned char workspace[256];
  driver::TensorMap map{};
  int calls = 0;
  auto failing = [&](const TensorMapRequest &, driver::TensorMap &) {
    ++calls;
    throw std::runtime_error("cuTensorMapEncodeTiled failed");
  };
  CHECK_THROWS_AS(cache.get(0, rows(workspace, 256), map, failing), std::runtime_error);
  CountingEncoder encoder;
  auto encode = [&](const TensorMapRequest &request, driver::TensorMap &out) { encoder(request, out); };
  cache.get(0, rows(workspace, 256), map, encode);
  CHECK(calls == 1);
  CHECK(encoder.calls == 1);
}
