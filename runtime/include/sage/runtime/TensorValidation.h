// The rules every entry point (forward, backward, SLA) applies to a caller's tensor descriptions, in one place so
// that they agree: rank, sizes, strides, dtype, device, alignment, contiguity, shapes, and that nothing written shares
// memory with anything else. Every failure is an ArgumentError naming the argument, saying what was expected and
// what was given. Extents are computed with overflow checks: a description whose span does not fit the address space
// is refused by name, and no overlap test wraps past 2^64.
#pragma once

#include "sage/runtime/TensorDescription.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace sage::runtime {

std::string shapeText(const TensorDescription &tensor); // "[2, 8, 300, 64]"

// Data not null, `rank` dimensions of positive size, non-negative strides, `device`, `dtype`, and data aligned to the
// element size (a misaligned f32 or f16 pointer faults on the device).
void checkTensorBasics(const TensorDescription &tensor, std::string_view name, int rank, DataType dtype, int device);

// Data aligned to `bytes`; `why` says which access needs it.
void checkAlignment(const TensorDescription &tensor, std::string_view name, int64_t bytes, std::string_view why);

// Exactly `expected`'s sizes; `meaning` names the dimensions, e.g. "batch, heads_q, tokens_q, head_dim".
void checkShape(const TensorDescription &tensor, std::string_view name, std::initializer_list<int64_t> expected,
                std::string_view meaning);

// Row-major contiguous (a dimension of size 1 may have any stride: it is never stepped over).
void checkContiguous(const TensorDescription &tensor, std::string_view name);

// A written tensor: no two elements at one address (a stride-0 or overlapping view would race).
void checkNonOverlapping(const TensorDescription &tensor, std::string_view name);

// Bytes from the data pointer to the end of the last element; throws when that exceeds 2^63 or data + extent wraps
// past 2^64.
uint64_t extentBytes(const TensorDescription &tensor, std::string_view name);

// A span of memory an entry point reads or writes.
struct MemoryRegion {
  std::string_view name; // the argument: a string literal or other storage that outlives the check
  uintptr_t begin = 0;
  uint64_t bytes = 0; // begin + bytes <= 2^64
  bool written = false;
};

MemoryRegion regionOf(const TensorDescription &tensor, std::string_view name, bool written);
// `bytes` at `data`; throws naming `name` when they wrap past the end of the address space.
MemoryRegion bufferRegion(const void *data, uint64_t bytes, std::string_view name, bool written);

// The regions of one call: whatever is written must share no byte with any other region, read or written.
class MemoryRegions {
public:
  static constexpr size_t kCapacity = 16;
  void add(const MemoryRegion &region); // empty regions are ignored
  // Throws ArgumentError naming the written region of the first overlapping pair (the later one when both are).
  void checkDisjoint() const;
  size_t size() const { return count_; }

private:
  std::array<MemoryRegion, kCapacity> regions_{};
  size_t count_ = 0;
};

// The workspace of a call: non-null, `alignment`-aligned, at least `needed` bytes (`sizing` names the call that gives
// the size), and its first `needed` bytes (the ones the kernels use) disjoint from every region in `regions`.
void checkWorkspace(MemoryRegions regions, const void *workspace, size_t given, size_t needed, size_t alignment,
                    std::string_view sizing);

} // namespace sage::runtime
