// Shape checks and head-matrix helpers shared by the SLA reference's files.
#pragma once

#include "sage/reference/Sla.h"

#include <cstdint>
#include <string>
#include <vector>

namespace sage::reference::sla_detail {

// Throws std::invalid_argument naming the argument when Q, K, V, the projection or the classes disagree.
void validateSlaInputs(const AttentionVariant &variant, const HostTensor &q, const HostTensor &k, const HostTensor &v,
                       const Projection &projection, const BlockClasses *classes);

// One head of a tensor as a row-major [tokens][dim] matrix of doubles.
std::vector<double> headValues(const HostTensor &tensor, int64_t b, int64_t h);

inline int64_t blocksOf(int64_t tokens, int64_t block) { return (tokens + block - 1) / block; }

} // namespace sage::reference::sla_detail
