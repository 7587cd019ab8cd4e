#include "sage/schedules/KernelPlan.h"

#include <algorithm>

namespace sage::schedules {

int64_t ScaleIndexing::groupOf(int64_t token) const {
  if (!used || tokens_per_group == 0)
    return 0;
  return token / tokens_per_group * interleave + token % interleave;
}

ScaleIndexing scaleIndexingOf(const QuantizerSpec &spec, int block_tokens) {
  ScaleIndexing indexing;
  indexing.used = spec.quantized();
  if (!indexing.used)
    return indexing;
  switch (spec.granularity) {
  case Granularity::per_token:
    indexing.tokens_per_group = 1;
    break;
  case Granularity::per_block:
  case Granularity::per_warp:
    indexing.tokens_per_group = spec.group_tokens > 0 ? spec.group_tokens : block_tokens;
    break;
  case Granularity::per_thread:
    indexing.tokens_per_group = spec.group_tokens > 0 ? spec.group_tokens : block_tokens;
    indexing.interleave = 8;
    break;
  default:
    indexing.tokens_per_group = 0; // per_tensor: one scale
    break;
  }
  return indexing;
}

int64_t GridMapping::tilesFor(const ProblemShape &shape) const {
  return (shape.tokens_q + block_q - 1) / block_q * shape.heads_q * shape.batch;
}

std::array<int64_t, 3> GridMapping::gridFor(const ProblemShape &shape, int multiprocessors) const {
  if (persistent_ctas_per_multiprocessor > 0) {
    const int64_t tiles = tilesFor(shape);
    const int64_t resident = static_cast<int64_t>(persistent_ctas_per_multiprocessor) * multiprocessors;
    return {resident > 0 ? std::min(tiles, resident) : tiles, 1, 1};
  }
  return {(shape.tokens_q + block_q - 1) / block_q, shape.heads_q, shape.batch};
}

std::string GridMapping::description() const {
  if (persistent_ctas_per_multiprocessor > 0) {
    std::string text = "persistent: " + std::to_string(persistent_ctas_per_multiprocessor) +
                       " CTA(s) per SM walk the (Q block of " + std::to_string(block_q) + " rows, head, batch) tiles";
    if (reverse_q_blocks)
      text += ", longest rows first (causal)";
    return text;
  }
  std::string text = "grid = (ceil(tokens_q / " + std::to_string(block_q) + "), heads_q, batch); block x = Q block";
  if (reverse_q_blocks)
    text += " counted from the last (causal: longest rows first)";
  return text;
}

int bytesOf(ElementType type) {
  switch (type) {
  case ElementType::f32:
    return 4;
  case ElementType::f16:
  case ElementType::bf16:
    return 2;
  case ElementType::int8:
  case ElementType::int4:
  case ElementType::e4m3:
  case ElementType::e5m2:
  case ElementType::e2m1:
    return 1;
  }
  return 0;
}

} // namespace sage::schedules
