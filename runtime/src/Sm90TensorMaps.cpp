#include "sage/runtime/Sm90TensorMaps.h"

#include "sage/runtime/CudaDriver.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace sage::runtime {
namespace {

constexpr std::uint64_t kTmaAlignment = 16;                     // bytes: global address and every stride
constexpr std::uint64_t kMaxDimension = std::uint64_t{1} << 32; // elements per dimension
constexpr std::uint64_t kMaxStride = std::uint64_t{1} << 40;    // bytes
constexpr std::int64_t kMaxCoordinate = std::numeric_limits<std::int32_t>::max(); // the kernel's coordinates

driver::TensorMapSwizzle swizzleOf(int inner_bytes) {
  switch (inner_bytes) {
  case 128:
    return driver::TensorMapSwizzle::bytes128;
  case 64:
    return driver::TensorMapSwizzle::bytes64;
  case 32:
    return driver::TensorMapSwizzle::bytes32;
  default:
    throw std::invalid_argument(
        fmt::format("plan: a TMA box row of {} bytes has no swizzle (32, 64 or 128)", inner_bytes));
  }
}

void requireRows(const char *what, std::int64_t rows) {
  if (rows <= 0 || rows > kMaxCoordinate)
    throw std::invalid_argument(fmt::format("shape: {} spans {} rows; the sm90 kernel addresses at most {} "
                                            "(32-bit TMA coordinates)",
                                            what, rows, kMaxCoordinate));
}

// A [rows][row_bytes] region of the workspace, read in boxes of `box`.
void encodeRows(driver::TensorMap &map, const unsigned char *address, std::int64_t row_bytes, std::int64_t rows,
                const schedules::TensorMapBox &box) {
  const std::uint64_t dims[2] = {static_cast<std::uint64_t>(row_bytes), static_cast<std::uint64_t>(rows)};
  const std::uint64_t strides[1] = {static_cast<std::uint64_t>(row_bytes)};
  const unsigned boxes[2] = {static_cast<unsigned>(box.inner_bytes), static_cast<unsigned>(box.rows)};
  CudaDriver::instance().encodeTensorMap(map, 2, address, dims, strides, boxes, swizzleOf(box.inner_bytes));
}

} // namespace

namespace {

// V's byte strides as TMA takes them: a dimension of size 1 has no meaningful stride (PyTorch may report 0 or
// anything for it), so it gets the one a compact tensor would have.
std::array<std::int64_t, 3> valueByteStrides(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                                             const ValueTensor &v) {
  constexpr std::int64_t kElementBytes = 2;
  const std::int64_t token = shape.tokens_kv == 1 ? plan.head_dim * kElementBytes : v.strides.token * kElementBytes;
  const std::int64_t head = shape.heads_kv == 1 ? token * shape.tokens_kv : v.strides.head * kElementBytes;
  const std::int64_t batch = shape.batch == 1 ? head * shape.heads_kv : v.strides.batch * kElementBytes;
  return {token, head, batch};
}

} // namespace

std::string valueTensorProblem(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                               const ValueTensor &v) {
  if (plan.v_source != schedules::ValueSource::input)
    return {};
  if (reinterpret_cast<std::uintptr_t>(v.data) % kTmaAlignment != 0)
    return fmt::format("v: the sm90 schedule reads V in place with TMA, which needs a 16-byte aligned pointer (got "
                       "{} modulo 16)",
                       reinterpret_cast<std::uintptr_t>(v.data) % kTmaAlignment);
  const std::array<std::int64_t, 3> strides = valueByteStrides(plan, shape, v);
  const char *names[3] = {"token", "head", "batch"};
  for (int i = 0; i < 3; ++i)
    if (strides[i] <= 0 || strides[i] % static_cast<std::int64_t>(kTmaAlignment) != 0 ||
        static_cast<std::uint64_t>(strides[i]) >= kMaxStride)
      return fmt::format("v: the sm90 schedule reads V in place with TMA, which needs positive {} strides that are "
                         "multiples of 8 elements (16 bytes) and below 2^39 elements; got {}",
                         names[i], strides[i] / 2);
  return {};
}

schedules::ProblemShape valueTensorShape(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                                         const SageSequenceOffsets &sequences) {
  if (!plan.packed_sequences)
    return shape;
  schedules::ProblemShape packed = shape;
  packed.batch = 1;
  packed.tokens_kv = std::max(1, sequences.total_kv);
  return packed;
}

bool claimsTiles(const schedules::KernelPlan &plan) {
  return plan.warp_specialization.consumer_warpgroups > 0 && plan.grid.persistent_ctas_per_multiprocessor > 0;
}

SageSm90AttentionParams makeSm90AttentionParams(const schedules::KernelPlan &plan, const schedules::ProblemShape &shape,
                                                const schedules::WorkspaceLayout &layout,
                                                const SageAttentionParams &base, const ValueTensor &v,
                                                const QkRows &qk_rows) {
  const schedules::WarpSpecialization &ws = plan.warp_specialization;
  if (ws.consumer_warpgroups <= 0)
    throw std::invalid_argument("plan: not a warp-specialised (sm90) plan");
  SageSm90AttentionParams params{};
  params.base = base;
  const std::int64_t qk_row_bytes = plan.head_dim * schedules::bytesOf(plan.qk_operand);
  const std::int64_t q_rows = shape.batch * shape.heads_q * layout.padded_q;
  const std::int64_t kv_rows = shape.batch * shape.heads_kv * layout.padded_kv;
  requireRows("Q (batch x heads_q x padded tokens_q)", q_rows);
  requireRows("K and V (batch x heads_kv x padded tokens_kv)", kv_rows);
  const unsigned char *workspace = base.workspace;
  driver::TensorMap q_map, k_map, v_map;
  encodeRows(q_map, qk_rows.q ? static_cast<const unsigned char *>(qk_rows.q) : workspace + layout.q_codes.offset,
             qk_row_bytes, q_rows, ws.q_box);
  encodeRows(k_map, qk_rows.k ? static_cast<const unsigned char *>(qk_rows.k) : workspace + layout.k_codes.offset,
             qk_row_bytes, kv_rows, ws.k_box);

  switch (plan.v_source) {
  case schedules::ValueSource::workspace_codes: { // V^T: [b * h_kv * d rows][padded_kv bytes]
    const std::int64_t rows = shape.batch * shape.heads_kv * plan.head_dim;
    requireRows("V^T (batch x heads_kv x head_dim)", rows);
    const std::uint64_t dims[2] = {static_cast<std::uint64_t>(layout.padded_kv), static_cast<std::uint64_t>(rows)};
    const std::uint64_t strides[1] = {static_cast<std::uint64_t>(layout.padded_kv)};
    const unsigned boxes[2] = {static_cast<unsigned>(ws.v_box.inner_bytes), static_cast<unsigned>(ws.v_box.rows)};
    CudaDriver::instance().encodeTensorMap(v_map, 2, workspace + layout.v_codes.offset, dims, strides, boxes,
                                           swizzleOf(ws.v_box.inner_bytes));
    break;
  }
  case schedules::ValueSource::workspace_values:
    encodeRows(v_map, workspace + layout.v_values.offset, 2 * plan.head_dim, kv_rows, ws.v_box);
    break;
  case schedules::ValueSource::input: { // the caller's V: [b][h_kv][tokens_kv][d] with its own strides
    const schedules::ProblemShape v_shape = valueTensorShape(plan, shape, base.sequences);
    if (const std::string problem = valueTensorProblem(plan, v_shape, v); !problem.empty())
      throw std::invalid_argument(problem);
    const std::array<std::int64_t, 3> byte_strides = valueByteStrides(plan, v_shape, v);
    if (static_cast<std::uint64_t>(v_shape.tokens_kv) >= kMaxDimension || v_shape.tokens_kv > kMaxCoordinate)
      throw std::invalid_argument("shape: tokens_kv must be below 2^31 for the sm90 schedule");
    const std::uint64_t dims[4] = {
        static_cast<std::uint64_t>(2 * plan.head_dim), static_cast<std::uint64_t>(v_shape.tokens_kv),
        static_cast<std::uint64_t>(v_shape.heads_kv), static_cast<std::uint64_t>(v_shape.batch)};
    const std::uint64_t strides[3] = {static_cast<std::uint64_t>(byte_strides[0]),
                                      static_cast<std::uint64_t>(byte_strides[1]),
                                      static_cast<std::uint64_t>(byte_strides[2])};
    const unsigned boxes[4] = {static_cast<unsigned>(ws.v_box.inner_bytes), static_cast<unsigned>(ws.v_box.rows), 1, 1};
    CudaDriver::instance().encodeTensorMap(v_map, 4, v.data, dims, strides, boxes, swizzleOf(ws.v_box.inner_bytes));
    break;
  }
  }
  // Persistent CTAs claim their tiles from the workspace's counter, zeroed before the launch (AttentionRunner::run).
  if (claimsTiles(plan))
    params.tile_counter =
        reinterpret_cast<unsigned *>(const_cast<unsigned char *>(workspace) + layout.attention_counters.offset);
  static_assert(sizeof(driver::TensorMap) == sizeof(SageTensorMap) && alignof(SageTensorMap) == 64);
  std::memcpy(&params.q_map, &q_map, sizeof q_map);
  std::memcpy(&params.k_map, &k_map, sizeof k_map);
  std::memcpy(&params.v_map, &v_map, sizeof v_map);
  return params;
}

} // namespace sage::runtime
