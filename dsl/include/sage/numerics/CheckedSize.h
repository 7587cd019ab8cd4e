// Products of user-given sizes in checked signed 64-bit arithmetic: a size that overflows is an error with its
// name, never a wrapped value that later sizes an allocation or a loop.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace sage::numerics {

// The product of non-negative `factors`, or nothing when a factor is negative or the product passes INT64_MAX.
inline std::optional<int64_t> checkedProduct(std::initializer_list<int64_t> factors) {
  int64_t product = 1;
  for (int64_t factor : factors)
    if (factor < 0 || __builtin_mul_overflow(product, factor, &product))
      return std::nullopt;
  return product;
}

// The product, or std::invalid_argument naming `what` and the limit when it exceeds `limit` or 64 bits.
inline int64_t productAtMost(std::initializer_list<int64_t> factors, int64_t limit, std::string_view what) {
  std::optional<int64_t> product = checkedProduct(factors);
  if (!product || *product > limit) {
    std::string text;
    for (int64_t factor : factors)
      text += (text.empty() ? "" : " x ") + std::to_string(factor);
    throw std::invalid_argument(std::string(what) + ": " + text + (product ? " = " + std::to_string(*product) : "") +
                                " exceeds the limit of " + std::to_string(limit));
  }
  return *product;
}

} // namespace sage::numerics
