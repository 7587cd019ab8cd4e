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

enum MapSlot : std::size_t { q_slot, k_slot, v_slot };

// The map of `request`: from `cache` when it holds this slot's map for the same request, else encoded by the driver.
void encode(TensorMapCache *cache, MapSlot slot, const TensorMapRequest &request, driver::TensorMap &map) {
  const auto encodeNow = [](const TensorMapRequest &r, driver::TensorMap &out) {
    CudaDriver::instance().encodeTensorMap(out, r.rank, r.address, r.dims.data(), r.strides.data(), r.box.data(),
                                           r.swizzle);
  };
  if (cache)
    cache->get(slot, request, map, encodeNow);
  else
    encodeNow(request, map);
}

// A 2-D [rows][row_bytes] byte tensor read in boxes of `box` (rows of `row_stride` bytes).
TensorMapRequest rowsRequest(const void *address, std::int64_t row_bytes, std::int64_t row_stride, std::int64_t rows,
                             const schedules::TensorMapBox &box) {
  TensorMapRequest request;
  request.rank = 2;
  request.address = address;
  request.dims[0] = static_cast<std::uint64_t>(row_bytes);
  request.dims[1] = static_cast<std::uint64_t>(rows);
  request.strides[0] = static_cast<std::uint64_t>(row_stride);
  request.box[0] = static_cast<unsigned>(box.inner_bytes);
  request.box[1] = static_cast<unsigned>(box.rows);
  request.swizzle = swizzleOf(box.inner_bytes);
  return request;
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
                                                const QkRows &qk_rows, TensorMapCache *cache) {
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
  encode(cache, q_slot,
         rowsRequest(qk_rows.q ? qk_rows.q : workspace + layout.q_codes.offset, qk_row_bytes, qk_row_bytes, q_rows,
                     ws.q_box),
         q_map);
  encode(cache, k_slot,
         rowsRequest(qk_rows.k ? qk_rows.k : workspace + layout.k_codes.offset, qk_row_bytes, qk_row_bytes, kv_rows,
                     ws.k_box),
         k_map);

  switch (plan.v_source) {
  case schedules::ValueSource::workspace_codes: { // V^T: [b * h_kv * d rows][padded_kv bytes]
    const std::int64_t rows = shape.batch * shape.heads_kv * plan.head_dim;
    requireRows("V^T (batch x heads_kv x head_dim)", rows);
    encode(cache, v_slot,
           rowsRequest(workspace + layout.v_codes.offset, layout.padded_kv, layout.padded_kv, rows, ws.v_box), v_map);
    break;
  }
  case schedules::ValueSource::workspace_values:
    encode(cache, v_slot,
           rowsRequest(workspace + layout.v_values.offset, 2 * plan.head_dim, 2 * plan.head_dim, kv_rows, ws.v_box),
           v_map);
    break;
  case schedules::ValueSource::input: { // the caller's V: [b][h_kv][tokens_kv][d] with its own strides
    const schedules::ProblemShape v_shape = valueTensorShape(plan, shape, base.sequences);
    if (const std::string problem = valueTensorProblem(plan, v_shape, v); !problem.empty())
      throw std::invalid_argument(problem);
    const std::array<std::int64_t, 3> byte_strides = valueByteStrides(plan, v_shape, v);
    if (static_cast<std::uint64_t>(v_shape.tokens_kv) >= kMaxDimension || v_shape.tokens_kv > kMaxCoordinate)
      throw std::invalid_argument("shape: tokens_kv must be below 2^31 for the sm90 schedule");
    TensorMapRequest request;
    request.rank = 4;
    request.address = v.data;
    request.dims = {static_cast<std::uint64_t>(2 * plan.head_dim), static_cast<std::uint64_t>(v_shape.tokens_kv),
                    static_cast<std::uint64_t>(v_shape.heads_kv), static_cast<std::uint64_t>(v_shape.batch), 0};
    request.strides = {static_cast<std::uint64_t>(byte_strides[0]), static_cast<std::uint64_t>(byte_strides[1]),
                       static_cast<std::uint64_t>(byte_strides[2]), 0};
    request.box = {static_cast<unsigned>(ws.v_box.inner_bytes), static_cast<unsigned>(ws.v_box.rows), 1, 1, 0};
    request.swizzle = swizzleOf(ws.v_box.inner_bytes);
    encode(cache, v_slot, request, v_map);
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
