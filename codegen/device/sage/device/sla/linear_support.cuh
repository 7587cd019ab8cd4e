// The helpers of SLA's linear-branch kernels, forward (linear_states.cuh, linear_output.cuh) and backward
// (backward.cuh): f16 hi + lo splits with power-of-two scales, 16-byte row I/O with a scalar fallback, cp.async,
// lane reductions, the feature map phi eight values at a time, and the CTA-wide sums of listed vectors and of
// d x d states stored in f16 with one scale each (H_i, dh_j).
#pragma once

#include "sage/device/sla/common.cuh"
#include "sage/device/sla/tensor_core.cuh"

namespace sage::device::sla {

// The backward's rows kernel accumulates dH_i with one thread per column and kRows rows of the d x d matrix.
template <int D> struct StateTile {
  static_assert((D * D) % kThreads == 0 && kThreads % D == 0, "D must be 16, 32, 64, 128 or 256");
  static constexpr int kRows = D * D / kThreads; // rows of a state per thread
  static constexpr int kGroups = kThreads / D;   // threads per column
  __device__ static int column() { return threadIdx.x % D; }
  __device__ static int first_row() { return (threadIdx.x / D) * kRows; }
};

// Splits 8 consecutive values into hi and lo f16 (kBf16: bf16) parts and stores each part as one 16-byte vector.
template <bool kBf16 = false>
__device__ __forceinline__ void store_split8(const float (&values)[8], float factor, unsigned short *hi,
                                             unsigned short *lo) {
  unsigned short h[8], l[8];
#pragma unroll
  for (int e = 0; e < 8; ++e)
    split_element<kBf16>(values[e] * factor, h[e], l[e]);
  *reinterpret_cast<uint4 *>(hi) =
      make_uint4(pack_f16x2(h[0], h[1]), pack_f16x2(h[2], h[3]), pack_f16x2(h[4], h[5]), pack_f16x2(h[6], h[7]));
  *reinterpret_cast<uint4 *>(lo) =
      make_uint4(pack_f16x2(l[0], l[1]), pack_f16x2(l[2], l[3]), pack_f16x2(l[4], l[5]), pack_f16x2(l[6], l[7]));
}

// f16x2 of two floats, `low` at the lower address, with one packed conversion (sm_80+): pack_f16x2(f16_bits(low),
// f16_bits(high)) bit for bit.
__device__ __forceinline__ unsigned pack_f16x2_rn(float low, float high) {
  unsigned bits;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
  return bits;
}

// split_f16 of two values with packed conversions (6 instructions per pair instead of 8, and no packing): the same
// hi and lo bits, as f16x2 words.
__device__ __forceinline__ void split_f16x2(float low, float high, unsigned &hi, unsigned &lo) {
  hi = pack_f16x2_rn(low, high);
  lo = pack_f16x2_rn(low - f16_value(static_cast<unsigned short>(hi & 0xffffu)),
                     high - f16_value(static_cast<unsigned short>(hi >> 16)));
}

// pack_f16x2_rn, or its bf16 form (kBf16).
template <bool kBf16> __device__ __forceinline__ unsigned pack_element_x2_rn(float low, float high) {
  if constexpr (kBf16) {
    unsigned bits;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bits) : "f"(high), "f"(low));
    return bits;
  } else {
    return pack_f16x2_rn(low, high);
  }
}

// split_f16x2, or its bf16 form (kBf16: hi + lo in bf16, ~16 bits; tensor_core.cuh says where a bf16 module uses it).
template <bool kBf16>
__device__ __forceinline__ void split_element_x2(float low, float high, unsigned &hi, unsigned &lo) {
  if constexpr (kBf16) {
    hi = pack_element_x2_rn<true>(low, high);
    lo = pack_element_x2_rn<true>(low - __uint_as_float(hi << 16), high - __uint_as_float(hi & 0xffff0000u));
  } else {
    split_f16x2(low, high, hi, lo);
  }
}

// store_split8 with split_f16x2 (the same bits).
template <bool kBf16 = false>
__device__ __forceinline__ void store_split8_packed(const float (&values)[8], float factor, unsigned short *hi,
                                                    unsigned short *lo) {
  unsigned h[4], l[4];
#pragma unroll
  for (int w = 0; w < 4; ++w)
    split_element_x2<kBf16>(values[2 * w] * factor, values[2 * w + 1] * factor, h[w], l[w]);
  *reinterpret_cast<uint4 *>(hi) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4 *>(lo) = make_uint4(l[0], l[1], l[2], l[3]);
}

// The power of two that brings max |x| (finite, > 0) into [2^14, 2^15): 2^-e for max = m 2^e, m in [0.5, 1).
__device__ __forceinline__ float f16_range_factor(float largest) {
  if (!(largest > 0.0f) || isinf(largest))
    return 1.0f;
  int exponent = 0;
  frexpf(largest, &exponent);
  return ldexpf(1.0f, 15 - exponent);
}

// ---- Vectorized I/O of the state and output kernels: rows of D f16 values (K, V, Q, O^s, O) and f32 vectors in
// 16-byte pieces of 8 values (f16) or 4 (f32). kLanes consecutive lanes of a warp hold one row, so a row's reductions
// are shuffles.

// Whether an f16 tensor's rows can be read 16 bytes at a time: a 16-byte-aligned base and strides of multiples of 8.
__device__ __forceinline__ bool rows_vectorizable(const void *base, const SageSlaStrides &strides) {
  return (reinterpret_cast<unsigned long long>(base) & 15u) == 0 &&
         ((strides.batch | strides.head | strides.token) & 7) == 0;
}

// 8 consecutive f16 values at `index`: one 16-byte load when `vector`, else 8 loads of 2 bytes. Plain loads (not
// __ldg): O^s may alias the output the same kernel writes.
__device__ __forceinline__ uint4 load_f16x8(const void *base, long long index, bool vector) {
  const unsigned short *at = static_cast<const unsigned short *>(base) + index;
  if (vector)
    return *reinterpret_cast<const uint4 *>(at);
  return make_uint4(pack_f16x2(at[0], at[1]), pack_f16x2(at[2], at[3]), pack_f16x2(at[4], at[5]),
                    pack_f16x2(at[6], at[7]));
}

__device__ __forceinline__ void store_f16x8(void *base, long long index, bool vector, uint4 bits) {
  unsigned short *at = static_cast<unsigned short *>(base) + index;
  if (vector) {
    *reinterpret_cast<uint4 *>(at) = bits;
    return;
  }
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    at[2 * w] = static_cast<unsigned short>(words[w] & 0xffffu);
    at[2 * w + 1] = static_cast<unsigned short>(words[w] >> 16);
  }
}

__device__ __forceinline__ void unpack_f16x8(uint4 bits, float (&x)[8]) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    x[2 * w] = f16_value(static_cast<unsigned short>(words[w] & 0xffffu));
    x[2 * w + 1] = f16_value(static_cast<unsigned short>(words[w] >> 16));
  }
}

__device__ __forceinline__ uint4 pack_f16x8(const float (&x)[8]) {
  return make_uint4(pack_f16x2_rn(x[0], x[1]), pack_f16x2_rn(x[2], x[3]), pack_f16x2_rn(x[4], x[5]),
                    pack_f16x2_rn(x[6], x[7]));
}

// unpack_f16x8 and pack_f16x8 in the module's element type (kBf16: bf16).
template <bool kBf16> __device__ __forceinline__ void unpack_x8(uint4 bits, float (&x)[8]) {
  if constexpr (kBf16) {
    const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      x[2 * w] = __uint_as_float(words[w] << 16);
      x[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
    }
  } else {
    unpack_f16x8(bits, x);
  }
}
template <bool kBf16> __device__ __forceinline__ uint4 pack_x8(const float (&x)[8]) {
  return make_uint4(pack_element_x2_rn<kBf16>(x[0], x[1]), pack_element_x2_rn<kBf16>(x[2], x[3]),
                    pack_element_x2_rn<kBf16>(x[4], x[5]), pack_element_x2_rn<kBf16>(x[6], x[7]));
}

// Sum and max over the kLanes consecutive lanes (a power of two <= 32) that hold one row.
template <int kLanes> __device__ __forceinline__ float lanes_sum(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
template <int kLanes> __device__ __forceinline__ float lanes_max(float value) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// phi over a row held by kLanes lanes, 8 features each (softmax is over the row). Every lane of the warp calls it.
template <int kLanes, int kPhi> __device__ __forceinline__ void feature_map_x8(float (&x)[8]) {
  if (kPhi == kPhiSoftmax) {
    float top = x[0];
#pragma unroll
    for (int e = 1; e < 8; ++e)
      top = fmaxf(top, x[e]);
    top = lanes_max<kLanes>(top);
    float sum = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = expf(x[e] - top);
      sum += x[e];
    }
    const float inverse = 1.0f / lanes_sum<kLanes>(sum);
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] *= inverse;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e)
      x[e] = kPhi == kPhiEluPlusOne ? (x[e] > 0.0f ? x[e] + 1.0f : expf(x[e])) : fmaxf(x[e], 0.0f);
  }
}

// The end of the sums over listed vectors below, once every thread has written its group's partial sums (group g's
// columns at scratch[g * D ...]): column threadIdx.x's total over the kGroups groups for threadIdx.x < D, 0 for the
// other threads; scratch is free again on return.
template <int D, int kGroups> __device__ __forceinline__ float sum_column_groups(const float *scratch) {
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x < D)
    for (int g = 0; g < kGroups; ++g)
      total += scratch[g * D + threadIdx.x];
  __syncthreads(); // scratch is free again
  return total;
}

// sum_listed_vectors with 16-byte loads: kGroups groups of D / 4 threads take every kGroups-th entry, four entries in
// flight per group (their list entries first, then the vectors). The sum's order is fixed (deterministic).
// `scratch`: SumListedX4<D>::kScratchFloats floats of shared memory, free on entry (and on return).
template <int D> struct SumListedX4 {
  static constexpr int kLanes = D / 4;
  static constexpr int kGroups = kThreads / kLanes < 8 ? kThreads / kLanes : 8;
  static constexpr int kScratchFloats = kGroups * D;
  static_assert(D % 4 == 0 && kThreads % kLanes == 0, "D / 4 divides the CTA");
};
template <int D>
__device__ float sum_listed_vectors_x4(const float *vectors, long long first, const int *list, int count,
                                       float *scratch) {
  constexpr int kLanes = SumListedX4<D>::kLanes, kGroups = SumListedX4<D>::kGroups;
  constexpr int kInFlight = 4;
  const int lane = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const float4 *base = reinterpret_cast<const float4 *>(vectors + first * D) + lane;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int n = group < kGroups ? group : count; n < count; n += kInFlight * kGroups) {
    int j[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      j[u] = n + u * kGroups < count ? list[n + u * kGroups] : -1;
    float4 value[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u)
      value[u] = j[u] >= 0 ? __ldg(base + static_cast<long long>(j[u]) * kLanes) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      sum.x += value[u].x;
      sum.y += value[u].y;
      sum.z += value[u].z;
      sum.w += value[u].w;
    }
  }
  if (group < kGroups)
    reinterpret_cast<float4 *>(scratch)[threadIdx.x] = sum; // group g's columns at scratch[g * D ...]
  return sum_column_groups<D, kGroups>(scratch);
}

__device__ __forceinline__ void accumulate_f16x8(float (&sum)[8], uint4 bits, float coefficient) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    sum[2 * w] = fmaf(coefficient, f16_value(static_cast<unsigned short>(words[w] & 0xffffu)), sum[2 * w]);
    sum[2 * w + 1] = fmaf(coefficient, f16_value(static_cast<unsigned short>(words[w] >> 16)), sum[2 * w + 1]);
  }
}

// sum over n < count of vectors[(first + list[n]) * D + c] for c = threadIdx.x < D (the other threads get 0), by the
// whole CTA (it has barriers): kThreads / D groups of D threads take every (kThreads / D)-th entry with four loads in
// flight each, instead of one thread per column waiting for list[n], then its vector, per entry (77 round trips to L2
// per q block at 95% sparsity). `scratch`: kThreads floats of shared memory, free on entry.
template <int D>
__device__ float sum_listed_vectors(const float *vectors, long long first, const int *list, int count, float *scratch) {
  constexpr int kGroups = kThreads / D;
  static_assert(kThreads % D == 0, "D divides the CTA");
  const int column = threadIdx.x % D, group = threadIdx.x / D;
  const float *base = vectors + first * D + column;
  float sum = 0.0f;
  int n = group;
  for (; n + 3 * kGroups < count; n += 4 * kGroups) {
    const int j0 = list[n], j1 = list[n + kGroups], j2 = list[n + 2 * kGroups], j3 = list[n + 3 * kGroups];
    const float a = base[static_cast<long long>(j0) * D], b = base[static_cast<long long>(j1) * D];
    const float c = base[static_cast<long long>(j2) * D], d = base[static_cast<long long>(j3) * D];
    sum += a;
    sum += b;
    sum += c;
    sum += d;
  }
  for (; n < count; n += kGroups)
    sum += base[static_cast<long long>(list[n]) * D];
  scratch[threadIdx.x] = sum;
  return sum_column_groups<D, kGroups>(scratch);
}

// Sums of d x d matrices stored in f16 with one f32 scale each (h_j, dH_i), in f32 registers: a thread owns
// kVectorsPerThread runs of 8 consecutive elements (row-major), read 16 bytes at a time.
template <int D> struct ScaledStateSum {
  static constexpr int kVectors = D * D / 8;
  static constexpr int kVectorsPerThread = (kVectors + kThreads - 1) / kThreads;
  __device__ static bool owns(int v) { return v * kThreads + static_cast<int>(threadIdx.x) < kVectors; }
  __device__ static int first_element(int v) { return (v * kThreads + threadIdx.x) * 8; }

  __device__ static void clear(float (&sum)[kVectorsPerThread][8]) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        sum[v][e] = 0.0f;
  }

  // sum += matrix (f32, row-major, 16-byte aligned)
  __device__ static void add_f32(float (&sum)[kVectorsPerThread][8], const float *matrix) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v)) {
        const float4 left = *reinterpret_cast<const float4 *>(matrix + first_element(v));
        const float4 right = *reinterpret_cast<const float4 *>(matrix + first_element(v) + 4);
        sum[v][0] += left.x, sum[v][1] += left.y, sum[v][2] += left.z, sum[v][3] += left.w;
        sum[v][4] += right.x, sum[v][5] += right.y, sum[v][6] += right.z, sum[v][7] += right.w;
      }
  }

  // sum += scales[m] * states[m]
  __device__ static void add_one(float (&sum)[kVectorsPerThread][8], const unsigned short *states, const float *scales,
                                 long long matrix) {
    const uint4 *vectors = reinterpret_cast<const uint4 *>(states);
    const float coefficient = scales[matrix];
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v))
        accumulate_f16x8(sum[v], __ldg(vectors + matrix * kVectors + v * kThreads + threadIdx.x), coefficient);
  }

  // sum += sign * sum over n < count of scales[m] * states[m], m = first + list[n]; each_matrix(m) too (the vectors
  // z_j, dZ_i). All of a matrix's loads are issued before its adds; the other warps of the SM cover the latency.
  template <typename EachMatrix>
  __device__ static void add_listed(float (&sum)[kVectorsPerThread][8], const unsigned short *states,
                                    const float *scales, long long first, const int *list, int count, float sign,
                                    EachMatrix each_matrix) {
    const uint4 *vectors = reinterpret_cast<const uint4 *>(states);
    for (int n = 0; n < count; ++n) {
      const long long matrix = first + list[n];
      uint4 bits[kVectorsPerThread];
#pragma unroll
      for (int v = 0; v < kVectorsPerThread; ++v)
        if (owns(v))
          bits[v] = __ldg(vectors + matrix * kVectors + v * kThreads + threadIdx.x);
      const float coefficient = sign * scales[matrix];
      each_matrix(matrix);
#pragma unroll
      for (int v = 0; v < kVectorsPerThread; ++v)
        if (owns(v))
          accumulate_f16x8(sum[v], bits[v], coefficient);
    }
  }

  // matrix (f32, row-major, rows of kStride elements) = sum
  template <int kStride> __device__ static void store_f32(float *matrix, const float (&sum)[kVectorsPerThread][8]) {
#pragma unroll
    for (int v = 0; v < kVectorsPerThread; ++v)
      if (owns(v)) {
        const int row = first_element(v) / D, column = first_element(v) % D;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          matrix[row * kStride + column + e] = sum[v][e];
      }
  }
};

} // namespace sage::device::sla
