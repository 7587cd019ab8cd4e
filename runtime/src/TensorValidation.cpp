// The shared tensor rules. They run on every call: each check is a comparison, and a message is built only when
// one fails.
#include "sage/runtime/TensorValidation.h"

#include "sage/runtime/ArgumentError.h"

#include <fmt/format.h>

#include <limits>
#include <stdexcept>

namespace sage::runtime {
namespace {

std::string deviceText(int device) {
  return device == kHostMemory ? std::string("host memory") : "CUDA device " + std::to_string(device);
}

[[noreturn]] void fail(std::string_view name, const std::string &problem) {
  throw ArgumentError(std::string(name), problem);
}

// "[0x1000, 0x2000)"
std::string spanText(const MemoryRegion &region) {
  return fmt::format("[{:#x}, {:#x})", region.begin, region.begin + region.bytes);
}

} // namespace

std::string shapeText(const TensorDescription &tensor) {
  std::string text = "[";
  for (int i = 0; i < tensor.rank && i < kMaxTensorRank; ++i)
    text += (i ? ", " : "") + std::to_string(tensor.shape[i]);
  return text + "]";
}

void checkTensorBasics(const TensorDescription &tensor, std::string_view name, int rank, DataType dtype, int device) {
  if (!tensor.data)
    fail(name, "the data pointer is null");
  if (tensor.rank != rank)
    fail(name, fmt::format("expected a {}-D tensor, got {} dimensions", rank, tensor.rank));
  for (int i = 0; i < rank; ++i) {
    if (tensor.shape[i] <= 0)
      fail(name, fmt::format("every size must be positive, got shape {}", shapeText(tensor)));
    if (tensor.strides[i] < 0)
      fail(name, fmt::format("strides must not be negative, got {} in dimension {}", tensor.strides[i], i));
  }
  if (tensor.device != device)
    fail(name, fmt::format("is in {}, expected CUDA device {} (where the kernels are loaded)",
                           deviceText(tensor.device), device));
  if (tensor.dtype != dtype)
    fail(name, fmt::format("expected dtype {}, got {}", nameOf(dtype), nameOf(tensor.dtype)));
  // Inline rather than checkAlignment: its reason would be a string built on every call.
  const auto address = reinterpret_cast<uintptr_t>(tensor.data);
  if (const int64_t bytes = bytesOf(dtype); bytes > 1 && address % static_cast<uint64_t>(bytes) != 0)
    fail(name,
         fmt::format("data must be {}-byte aligned ({} elements), got address {:#x}", bytes, nameOf(dtype), address));
}

void checkAlignment(const TensorDescription &tensor, std::string_view name, int64_t bytes, std::string_view why) {
  const auto address = reinterpret_cast<uintptr_t>(tensor.data);
  if (bytes > 1 && address % static_cast<uint64_t>(bytes) != 0)
    fail(name, fmt::format("data must be {}-byte aligned ({}), got address {:#x}", bytes, why, address));
}

void checkShape(const TensorDescription &tensor, std::string_view name, std::initializer_list<int64_t> expected,
                std::string_view meaning) {
  bool same = tensor.rank == static_cast<int>(expected.size());
  int axis = 0;
  for (int64_t size : expected)
    same = same && tensor.shape[axis++] == size;
  if (same)
    return;
  std::string text = "[";
  for (int64_t size : expected)
    text += (text.size() > 1 ? ", " : "") + std::to_string(size);
  fail(name, fmt::format("expected shape {}] ({}), got {}", text, meaning, shapeText(tensor)));
}

void checkContiguous(const TensorDescription &tensor, std::string_view name) {
  int64_t expected = 1;
  for (int i = tensor.rank - 1; i >= 0; --i) {
    if (tensor.shape[i] != 1 && tensor.strides[i] != expected)
      fail(name, fmt::format("must be contiguous: expected stride {} (elements) in dimension {}, got {}", expected, i,
                             tensor.strides[i]));
    if (__builtin_mul_overflow(expected, tensor.shape[i], &expected))
      fail(name, fmt::format("shape {} has more than 2^63 elements", shapeText(tensor)));
  }
}

void checkNonOverlapping(const TensorDescription &tensor, std::string_view name) {
  // Dimensions by increasing stride (insertion sort: at most 4).
  std::array<int, kMaxTensorRank> order{};
  for (int i = 0; i < tensor.rank; ++i) {
    int j = i;
    for (; j > 0 && tensor.strides[order[j - 1]] > tensor.strides[i]; --j)
      order[j] = order[j - 1];
    order[j] = i;
  }
  int64_t span = 1; // elements covered by the dimensions sorted so far
  for (int i = 0; i < tensor.rank; ++i) {
    const int dim = order[i];
    if (tensor.shape[dim] == 1)
      continue;
    if (tensor.strides[dim] < span)
      fail(name, fmt::format("is written, so its elements must not overlap; shape {} has stride {} in dimension {}",
                             shapeText(tensor), tensor.strides[dim], dim));
    if (__builtin_mul_overflow(tensor.strides[dim], tensor.shape[dim], &span))
      fail(name, fmt::format("shape {} with these strides spans more than 2^63 elements", shapeText(tensor)));
  }
}

uint64_t extentBytes(const TensorDescription &tensor, std::string_view name) {
  int64_t last = 0; // offset of the last element, in elements
  for (int i = 0; i < tensor.rank && i < kMaxTensorRank; ++i) {
    if (tensor.shape[i] <= 0)
      return 0; // no elements
    int64_t term = 0;
    if (tensor.strides[i] < 0 || __builtin_mul_overflow(tensor.shape[i] - 1, tensor.strides[i], &term) ||
        __builtin_add_overflow(last, term, &last))
      fail(name, fmt::format("shape {} with these strides spans more than 2^63 elements", shapeText(tensor)));
  }
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, bytesOf(tensor.dtype), &bytes))
    fail(name, fmt::format("shape {} with these strides spans more than 2^63 bytes", shapeText(tensor)));
  bufferRegion(tensor.data, static_cast<uint64_t>(bytes), name, false); // the wrap check
  return static_cast<uint64_t>(bytes);
}

MemoryRegion regionOf(const TensorDescription &tensor, std::string_view name, bool written) {
  return {name, reinterpret_cast<uintptr_t>(tensor.data), extentBytes(tensor, name), written};
}

MemoryRegion bufferRegion(const void *data, uint64_t bytes, std::string_view name, bool written) {
  const auto begin = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data));
  if (bytes > std::numeric_limits<uint64_t>::max() - begin)
    fail(name, fmt::format("its {} bytes at address {:#x} wrap past the end of the address space", bytes, begin));
  return {name, static_cast<uintptr_t>(begin), bytes, written};
}

void MemoryRegions::add(const MemoryRegion &region) {
  if (region.bytes == 0)
    return;
  if (count_ == kCapacity)
    throw std::logic_error("MemoryRegions: more than 16 regions in one call");
  regions_[count_++] = region;
}

void MemoryRegions::checkDisjoint() const {
  for (size_t later = 1; later < count_; ++later)
    for (size_t earlier = 0; earlier < later; ++earlier) {
      const MemoryRegion &a = regions_[earlier], &b = regions_[later];
      if (!a.written && !b.written)
        continue; // inputs may share memory (q = k, a packed qkv)
      // Half-open spans, none wrapping (bufferRegion): begin + bytes cannot overflow.
      if (a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes) {
        const MemoryRegion &named = b.written ? b : a, &other = b.written ? a : b;
        fail(named.name, fmt::format("overlaps {} in memory: expected disjoint memory ({} is written), got {} at bytes "
                                     "{} and {} at {}",
                                     other.name, named.name, named.name, spanText(named), other.name, spanText(other)));
      }
    }
}

void checkWorkspace(MemoryRegions regions, const void *workspace, size_t given, size_t needed, size_t alignment,
                    std::string_view sizing) {
  if (!workspace)
    fail("workspace", fmt::format("expected {} bytes of device memory ({}), got a null pointer", needed, sizing));
  if (given < needed)
    fail("workspace", fmt::format("expected at least {} bytes ({}), got {}", needed, sizing, given));
  const auto address = reinterpret_cast<uintptr_t>(workspace);
  if (alignment > 1 && address % alignment != 0)
    fail("workspace", fmt::format("data must be {}-byte aligned, got address {:#x}", alignment, address));
  regions.add(bufferRegion(workspace, needed, "workspace", true));
  regions.checkDisjoint();
}

} // namespace sage::runtime
