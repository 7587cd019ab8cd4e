// Checks shared by the reference's entry points (Reference.cpp, PackedReference.cpp).
#pragma once

#include "sage/reference/Reference.h"

#include <cstdint>
#include <optional>
#include <string_view>

namespace sage::reference::detail {

// Throws std::invalid_argument naming the argument when Q, K, V (and the block mask) disagree with each other or with
// the variant (its packed_sequences aside: the caller decides how the batch is laid out).
void validateShapes(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                    const BlockMask *block_mask);

// checkReferenceShape's two halves: the memory of a run of this shape, and `multiply_adds` (nothing: past 2^63)
// against kMaxReferenceWork, `formula` saying what was counted.
void checkReferenceMemory(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t n_q, int64_t n_kv, int64_t d);
void checkReferenceWork(std::optional<int64_t> multiply_adds, std::string_view formula);

} // namespace sage::reference::detail
