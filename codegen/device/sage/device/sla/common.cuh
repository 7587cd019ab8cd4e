// Helpers of SLA's kernels: f16 / bf16 loads and f16 stores, warp and block reductions, the feature maps phi.
#pragma once

#include "sage/device/sla/abi.cuh"

namespace sage::device::sla {

constexpr int kThreads = 256; // every SLA kernel runs 8 warps
constexpr int kWarps = kThreads / 32;

// Feature maps, as sage::FeatureMap numbers them.
constexpr int kPhiSoftmax = 0;
constexpr int kPhiEluPlusOne = 1;
constexpr int kPhiRelu = 2;

__device__ __forceinline__ float load_f16(const void *base, long long index) {
  const unsigned short bits = static_cast<const unsigned short *>(base)[index];
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));
  return value;
}

// load_f16, or a bf16 element (kBf16; exact in f32).
template <bool kBf16> __device__ __forceinline__ float load_element(const void *base, long long index) {
  if constexpr (kBf16)
    return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short *>(base)[index]) << 16);
  else
    return load_f16(base, index);
}

__device__ __forceinline__ void store_f16(void *base, long long index, float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  static_cast<unsigned short *>(base)[index] = bits;
}

__device__ __forceinline__ long long element_index(const SageSlaStrides &strides, int b, int h, int t, int c) {
  return b * strides.batch + h * strides.head + t * strides.token + c;
}

__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Reduces over the CTA; every thread gets the result. `scratch` holds kWarps floats.
template <bool kMax> __device__ float block_reduce(float value, float *scratch) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  value = kMax ? warp_max(value) : warp_sum(value);
  __syncthreads();
  if (lane == 0)
    scratch[warp] = value;
  __syncthreads();
  float total = scratch[0];
  for (int w = 1; w < kWarps; ++w)
    total = kMax ? fmaxf(total, scratch[w]) : total + scratch[w];
  return total;
}

// phi over one row of D values held in shared memory, in place, by one warp (softmax is over the features).
template <int D, int kPhi> __device__ void feature_map_row(float *row) {
  const int lane = threadIdx.x % 32;
  if (kPhi == kPhiSoftmax) {
    float top = -__int_as_float(0x7f800000);
    for (int c = lane; c < D; c += 32)
      top = fmaxf(top, row[c]);
    top = warp_max(top);
    float sum = 0.0f;
    for (int c = lane; c < D; c += 32) {
      row[c] = expf(row[c] - top);
      sum += row[c];
    }
    sum = warp_sum(sum);
    for (int c = lane; c < D; c += 32)
      row[c] /= sum;
  } else if (kPhi == kPhiEluPlusOne) {
    for (int c = lane; c < D; c += 32)
      row[c] = row[c] > 0.0f ? row[c] + 1.0f : expf(row[c]);
  } else {
    for (int c = lane; c < D; c += 32)
      row[c] = fmaxf(row[c], 0.0f);
  }
  __syncwarp();
}

// phi over one row held by a warp in registers: lane l holds x[u] = row[l + 32 u]; entries past D are 0 on return.
template <int D, int kPhi> __device__ __forceinline__ void feature_map_lanes(float (&x)[(D + 31) / 32]) {
  constexpr int kPerLane = (D + 31) / 32;
  const int lane = threadIdx.x % 32;
  if (kPhi == kPhiSoftmax) {
    float top = -__int_as_float(0x7f800000);
    for (int u = 0; u < kPerLane; ++u)
      if (lane + 32 * u < D)
        top = fmaxf(top, x[u]);
    top = warp_max(top);
    float sum = 0.0f;
    for (int u = 0; u < kPerLane; ++u) {
      x[u] = lane + 32 * u < D ? expf(x[u] - top) : 0.0f;
      sum += x[u];
    }
    sum = warp_sum(sum);
    for (int u = 0; u < kPerLane; ++u)
      x[u] /= sum;
  } else {
    for (int u = 0; u < kPerLane; ++u) {
      const float value = kPhi == kPhiEluPlusOne ? (x[u] > 0.0f ? x[u] + 1.0f : expf(x[u])) : fmaxf(x[u], 0.0f);
      x[u] = lane + 32 * u < D ? value : 0.0f;
    }
  }
}

// The vector-Jacobian product of phi for one row, by one warp: dx += J_phi(x)^T dy, with y = phi(x) given.
template <int D, int kPhi>
__device__ void feature_map_backward_row(const float *x, const float *y, const float *dy, float *dx) {
  const int lane = threadIdx.x % 32;
  if (kPhi == kPhiSoftmax) {
    float inner = 0.0f;
    for (int c = lane; c < D; c += 32)
      inner += dy[c] * y[c];
    inner = warp_sum(inner);
    for (int c = lane; c < D; c += 32)
      dx[c] += y[c] * (dy[c] - inner);
  } else if (kPhi == kPhiEluPlusOne) {
    for (int c = lane; c < D; c += 32)
      dx[c] += x[c] > 0.0f ? dy[c] : dy[c] * y[c]; // y = exp(x) there
  } else {
    for (int c = lane; c < D; c += 32)
      dx[c] += x[c] > 0.0f ? dy[c] : 0.0f;
  }
  __syncwarp();
}

// The fused sparse backward's work list for kv block j of batch b (both kernels, mma.sync and wgmma): per q head h,
// how many critical q blocks its column has (column_counts' first entry) and the n-th of them.
struct CriticalColumnList {
  const int *counts, *blocks;
  int b, heads_q, kv_blocks, j, q_blocks;
  __device__ __forceinline__ long long column(int h) const {
    return (static_cast<long long>(b) * heads_q + h) * kv_blocks + j;
  }
  __device__ __forceinline__ int count(int h) const { return counts[column(h) * 3]; }
  __device__ __forceinline__ int block(int h, int n) const { return blocks[column(h) * q_blocks + n]; }
};

// One work unit of the fused sparse backward (abi.cuh's SageSlaSparseBackwardParams.sparse_units): `items` items of
// kv block j's work list (CriticalColumnList's order: q heads of the GQA group in turn) from item n_first of q head
// h_first. `shared`: the kv block has other units, so its dK and dV rows take atomic adds.
struct SparseUnit {
  int b, h_kv, j, h_first, n_first, items;
  bool shared;
};

__device__ __forceinline__ SparseUnit sparse_unit(const int *units, int index, const SageSlaShape &shape) {
  const int4 raw = reinterpret_cast<const int4 *>(units)[index];
  const int column = raw.x, head_kv = column / shape.kv_blocks;
  return SparseUnit{head_kv / shape.heads_kv,
                    head_kv % shape.heads_kv,
                    column % shape.kv_blocks,
                    raw.y,
                    raw.z,
                    raw.w < 0 ? -raw.w : raw.w,
                    raw.w < 0};
}

// Appends kv block j's units (by one thread; launch 4, before 4c): its pairs over the GQA group's q heads split into
// ceil(pairs / unit_items) units of equal size (within one), none where it has no critical pair.
__device__ inline void list_sparse_units(const int *column_counts, int *units, int *unit_count, int unit_items,
                                         const SageSlaShape &shape, int b, int h_kv, int j) {
  const int group = shape.heads_q / shape.heads_kv, h_begin = h_kv * group;
  const CriticalColumnList list{column_counts, nullptr, b, shape.heads_q, shape.kv_blocks, j, shape.q_blocks};
  int pairs = 0;
  for (int h = h_begin; h < h_begin + group; ++h)
    pairs += list.count(h);
  if (pairs == 0)
    return;
  const int count = (pairs + unit_items - 1) / unit_items;
  const int first = atomicAdd(unit_count, count);
  const int column = (b * shape.heads_kv + h_kv) * shape.kv_blocks + j;
  int h = h_begin, n = 0, in_head = list.count(h); // the next unit's first item
  for (int u = 0; u < count; ++u) {
    const int begin = static_cast<int>(static_cast<long long>(u) * pairs / count);
    const int end = static_cast<int>(static_cast<long long>(u + 1) * pairs / count);
    while (n >= in_head) { // past this head's items: the next head's first
      ++h;
      n = 0;
      in_head = list.count(h);
    }
    reinterpret_cast<int4 *>(units)[first + u] = make_int4(column, h, n, count > 1 ? begin - end : end - begin);
    for (int left = end - begin; left > 0;) {
      const int take = min(left, in_head - n);
      n += take;
      left -= take;
      if (left > 0) {
        ++h;
        n = 0;
        in_head = list.count(h);
      }
    }
  }
}

} // namespace sage::device::sla
