// Grids and parameters of the prologue's launches. The CTA counts here are mirrored by the generated kernels'
// role dispatch (PrologueKernelSource.cpp): change both together.
#include "sage/codegen/PrologueLaunch.h"

#include "sage/codegen/PrologueConfig.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace sage::codegen {
namespace {

void require(bool condition, const std::string &message) {
  if (!condition)
    throw std::invalid_argument(message);
}

// A fixed message: no string is built when the check passes (makePrologueParams runs on every call).
void require(bool condition, const char *message) {
  if (!condition)
    throw std::invalid_argument(message);
}

int64_t ceilDiv(int64_t value, int64_t divisor) { return (value + divisor - 1) / divisor; }

void validateShape(const PrologueGeometry &geometry, const schedules::ProblemShape &shape) {
  require(shape.batch > 0 && shape.heads_q > 0 && shape.heads_kv > 0,
          "shape: batch, heads_q and heads_kv must be positive");
  require(shape.heads_q % shape.heads_kv == 0, "shape.heads_kv (" + std::to_string(shape.heads_kv) +
                                                   ") must divide heads_q (" + std::to_string(shape.heads_q) + ")");
  require(shape.tokens_q > 0 && shape.tokens_kv > 0, "shape: tokens_q and tokens_kv must be positive");
  require(shape.head_dim == geometry.head_dim, "shape.head_dim " + std::to_string(shape.head_dim) +
                                                   " does not match the prologue's head_dim " +
                                                   std::to_string(geometry.head_dim));
  // The kernels hold token counts (padded) and head indices in 32-bit ints.
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  require(ceilDiv(shape.tokens_q, geometry.block_q) * geometry.block_q <= kIntMax &&
              ceilDiv(shape.tokens_kv, geometry.block_kv) * geometry.block_kv <= kIntMax,
          "shape: padded token counts must fit in 32 bits");
  require(shape.batch <= kIntMax && shape.heads_q <= kIntMax, "shape: batch and heads must fit in 32 bits");
}

// Enough slices for statistics_ctas_per_tensor CTAs over all heads, each of at least statistics_min_slice_tokens.
int64_t statisticsSlices(const PrologueGeometry &geometry, int64_t kv_heads, int64_t tokens_kv) {
  const int64_t for_parallelism = std::max<int64_t>(1, ceilDiv(geometry.statistics_ctas_per_tensor, kv_heads));
  return std::min({for_parallelism, ceilDiv(tokens_kv, geometry.statistics_min_slice_tokens),
                   static_cast<int64_t>(geometry.max_statistics_slices)});
}

} // namespace

int64_t prologueRoleCtas(PrologueRole role, const PrologueGeometry &geometry, const schedules::ProblemShape &shape) {
  validateShape(geometry, shape);
  const int64_t q_heads = shape.batch * shape.heads_q;
  const int64_t kv_heads = shape.batch * shape.heads_kv;
  const int64_t q_blocks = ceilDiv(shape.tokens_q, geometry.block_q);
  const int64_t kv_blocks = ceilDiv(shape.tokens_kv, geometry.block_kv);
  const int64_t padded_kv = kv_blocks * geometry.block_kv;
  switch (role) {
  case PrologueRole::k_column_statistics:
  case PrologueRole::v_column_statistics:
    return kv_heads * statisticsSlices(geometry, kv_heads, shape.tokens_kv);
  case PrologueRole::q_block_statistics:
  case PrologueRole::q_block_quantize:
    return q_heads * q_blocks;
  case PrologueRole::k_block_quantize:
    return kv_heads * ceilDiv(kv_blocks, geometry.k_blocks_per_tile);
  case PrologueRole::v_tile_convert:
  case PrologueRole::v_tile_quantize:
    return kv_heads * ceilDiv(padded_kv, geometry.v_tile_tokens);
  }
  throw std::invalid_argument("prologueRoleCtas: unknown role");
}

LaunchGrid prologueGrid(const PrologueSource &prologue, size_t kernel, const schedules::ProblemShape &shape) {
  require(kernel < prologue.kernels.size(), "kernel: index " + std::to_string(kernel) + " is out of range (" +
                                                std::to_string(prologue.kernels.size()) + " kernels)");
  int64_t ctas = 0;
  for (PrologueRole role : prologue.kernels[kernel].roles)
    ctas += prologueRoleCtas(role, prologue.geometry, shape);
  require(ctas <= std::numeric_limits<int32_t>::max(),
          "shape: " + std::to_string(ctas) + " CTAs exceed the grid's x limit for " + prologue.kernels[kernel].name);
  LaunchGrid grid;
  grid.x = static_cast<unsigned>(ctas);
  return grid;
}

std::vector<LaunchGrid> prologueGrids(const PrologueSource &prologue, const schedules::ProblemShape &shape) {
  std::vector<LaunchGrid> grids;
  for (size_t kernel = 0; kernel < prologue.kernels.size(); ++kernel)
    grids.push_back(prologueGrid(prologue, kernel, shape));
  return grids;
}

size_t prologueCounterBytes(const PrologueSource &prologue, const schedules::WorkspaceLayout &layout) {
  for (const PrologueKernel &kernel : prologue.kernels)
    if (kernel.one_pass) {
      require(layout.prologue_counters.bytes > 0,
              "layout: a one-pass prologue needs the workspace's prologue_counters");
      return layout.prologue_counters.bytes;
    }
  return 0;
}

bool prologueOnlyCopiesQk(const AttentionVariant &variant, schedules::InputType input) {
  PrologueConfig config;
  try {
    config = makePrologueConfig(variant, input, variant.head_dim, {}, {});
  } catch (const std::invalid_argument &) {
    return false; // no prologue for it at all
  }
  // A packed batch's Q and K are never in the workspace's dense layout: its slots are gathered by the prologue.
  return config.q.cast() && config.k.cast() && !config.fold_q_scale && !config.smooth_q && !config.smooth_k &&
         !config.smooth_v && config.v_output == VOutput::none && !config.packed_sequences;
}

bool PrologueTensor::inWorkspaceLayout(int64_t batch, int64_t heads, int64_t tokens, int64_t padded_tokens,
                                       int head_dim) const {
  return data && reinterpret_cast<uintptr_t>(data) % 16 == 0 && tokens == padded_tokens && strides.token == head_dim &&
         (heads == 1 || strides.head == tokens * head_dim) &&
         (batch == 1 || strides.batch == heads * tokens * head_dim);
}

float prologueQPrescale(const AttentionVariant &variant) {
  if (!variant.q.fold_softmax_scale)
    return 1.0f;
  constexpr double kLog2e = 1.4426950408889634074;
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(variant.head_dim));
  return static_cast<float>(softmax_scale * (variant.exp2_softmax ? kLog2e : 1.0));
}

SagePrologueParams makePrologueParams(const AttentionVariant &variant, const schedules::ProblemShape &shape,
                                      const schedules::WorkspaceLayout &layout, const PrologueTensor &q,
                                      const PrologueTensor &k, const PrologueTensor &v, unsigned char *workspace) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  require(shape.batch <= kIntMax && shape.heads_q <= kIntMax && layout.padded_q <= kIntMax &&
              layout.padded_kv <= kIntMax && layout.q_scale_count <= kIntMax && layout.k_scale_count <= kIntMax,
          "shape: sizes must fit the kernels' 32-bit counts");
  // Runs on every call: messages are built only when a check fails.
  const auto checkTensor = [](const PrologueTensor &tensor, const char *name) {
    if (tensor.data == nullptr)
      throw std::invalid_argument(std::string(name) + ": null data pointer");
    if (reinterpret_cast<uintptr_t>(tensor.data) % 16 != 0)
      throw std::invalid_argument(std::string(name) +
                                  ": data must be 16-byte aligned (the prologue reads 8 elements at a time)");
    const SageTensorStrides &strides = tensor.strides;
    if (strides.batch % 8 != 0 || strides.head % 8 != 0 || strides.token % 8 != 0)
      throw std::invalid_argument(std::string(name) + ": strides must be multiples of 8 elements, got batch " +
                                  std::to_string(strides.batch) + ", head " + std::to_string(strides.head) +
                                  ", token " + std::to_string(strides.token));
  };
  checkTensor(q, "q");
  checkTensor(k, "k");
  checkTensor(v, "v");
  require(workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
          "workspace: must be a non-null, 256-byte aligned device pointer");

  SagePrologueParams params{};
  params.q = q.data;
  params.k = k.data;
  params.v = v.data;
  params.q_strides = q.strides;
  params.k_strides = k.strides;
  params.v_strides = v.strides;
  params.size.batch = static_cast<int>(shape.batch);
  params.size.heads_q = static_cast<int>(shape.heads_q);
  params.size.heads_kv = static_cast<int>(shape.heads_kv);
  params.size.tokens_q = static_cast<int>(shape.tokens_q);
  params.size.tokens_kv = static_cast<int>(shape.tokens_kv);
  params.size.padded_q = static_cast<int>(layout.padded_q);
  params.size.padded_kv = static_cast<int>(layout.padded_kv);
  params.size.q_scale_count = static_cast<int>(layout.q_scale_count);
  params.size.k_scale_count = static_cast<int>(layout.k_scale_count);
  params.q_prescale = prologueQPrescale(variant);
  params.workspace = workspace;
  params.offsets.q_codes = layout.q_codes.offset;
  params.offsets.q_scales = layout.q_scales.offset;
  params.offsets.k_codes = layout.k_codes.offset;
  params.offsets.k_scales = layout.k_scales.offset;
  params.offsets.k_mean = layout.k_mean.offset;
  params.offsets.q_mean = layout.q_mean.offset;
  params.offsets.v_values = layout.v_values.offset;
  params.offsets.v_codes = layout.v_codes.offset;
  params.offsets.v_scales = layout.v_scales.offset;
  params.offsets.v_mean = layout.v_mean.offset;
  params.offsets.delta_s = layout.delta_s.offset;
  params.statistics_offset = layout.prologue_statistics.offset;
  params.counters_offset = layout.prologue_counters.offset;
  params.cleared_word_offset = SAGE_NO_CLEARED_WORD; // the runner's to set, where an attention kernel needs it
  return params;
}

} // namespace sage::codegen
