// The LSE merge of two partial attention results (issue 30): per row, with L = log(e^(lse_a) + e^(lse_b)),
//
//   out = e^(lse_a - L) O_a + e^(lse_b - L) O_b,   lse_out = L = top + log(e^(lse_a - top) + e^(lse_b - top))
//
// in f32, shifted by top = max(lse_a, lse_b) so that no exponent overflows. A part with LSE = -inf (a row that saw
// no key) has weight 0 and its O is selected away, never multiplied, so it may hold anything (NaN included); a row
// masked in both parts gets lse_out = -inf and out = 0. Ring attention runs it once per step on row slices of its
// accumulator.
//
// Work split: lanes_per_row lanes of one warp share a row, each taking chunks of 8 elements (16-byte accesses of
// f16 / bf16, two of f32, where the host says every pointer and stride allows; element accesses otherwise). The
// group's first lane reads the two LSEs, computes the weights and hands them to the others by a shuffle, and it
// alone writes lse_out after that read: lse_out may be lse_a (and out may be O_a: each element is read, then written,
// by the same thread).
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/lanes.cuh"
#include "sage/device/merge/abi.cuh"

namespace sage::device::merge {

// An f16 or bf16 value's bits as f32, exactly, in integer and f32 instructions: f16 by moving its exponent and
// mantissa into f32's fields and scaling by 2^112 (exact; an f16 subnormal becomes an f32 subnormal first), infinities
// and NaNs by their all-ones exponent. (PTX's cvt.f32.f16 on 16-bit registers made ptxas spill here.)
template <int kType> __device__ __forceinline__ float decode_half(unsigned bits) {
  if constexpr (kType == SAGE_MERGE_BF16) {
    return __uint_as_float(bits << 16); // bf16 is the top half of an f32
  } else {
    const unsigned magnitude = bits & 0x7fffu, sign = (bits & 0x8000u) << 16;
    const float finite = __uint_as_float(magnitude << 13) * __uint_as_float(0x77800000u); // x 2^112
    const unsigned value = magnitude >= 0x7c00u ? (magnitude << 13) | 0x7f800000u : __float_as_uint(finite);
    return __uint_as_float(value | sign);
  }
}

// SAGE_MERGE_CHUNK elements of type kType at `base` + `offset` (elements) as f32.
template <int kType, bool kVectorized>
__device__ __forceinline__ void load_chunk(const void *base, long long offset, float (&values)[8]) {
  if constexpr (kType == SAGE_MERGE_F32) {
    const float *pointer = static_cast<const float *>(base) + offset;
    if constexpr (kVectorized) {
      const float4 low = reinterpret_cast<const float4 *>(pointer)[0];
      const float4 high = reinterpret_cast<const float4 *>(pointer)[1];
      values[0] = low.x, values[1] = low.y, values[2] = low.z, values[3] = low.w;
      values[4] = high.x, values[5] = high.y, values[6] = high.z, values[7] = high.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        values[i] = pointer[i];
    }
  } else {
    const unsigned short *pointer = static_cast<const unsigned short *>(base) + offset;
    if constexpr (kVectorized) {
      const uint4 packed = *reinterpret_cast<const uint4 *>(pointer);
      const unsigned words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        values[2 * i] = decode_half<kType>(words[i] & 0xffffu);
        values[2 * i + 1] = decode_half<kType>(words[i] >> 16);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        values[i] = decode_half<kType>(pointer[i]);
    }
  }
}

// Two f32 -> the 16-bit type's pair, round to nearest even; `low` in bits 0-15.
template <int kType> __device__ __forceinline__ unsigned pack_pair(float low, float high) {
  if constexpr (kType == SAGE_MERGE_BF16)
    return pack_bf16x2(low, high);
  else
    return pack_f16x2(low, high);
}

// One 16-byte store of four 32-bit words (PTX: NVVM splits a float4 store that follows a data-dependent branch into
// scalar ones).
__device__ __forceinline__ void store_16_bytes(void *pointer, unsigned x, unsigned y, unsigned z, unsigned w) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(pointer), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}

template <int kType, bool kVectorized>
__device__ __forceinline__ void store_chunk(void *base, long long offset, const float (&values)[8]) {
  if constexpr (kType == SAGE_MERGE_F32) {
    float *pointer = static_cast<float *>(base) + offset;
    if constexpr (kVectorized) {
      store_16_bytes(pointer, __float_as_uint(values[0]), __float_as_uint(values[1]), __float_as_uint(values[2]),
                     __float_as_uint(values[3]));
      store_16_bytes(pointer + 4, __float_as_uint(values[4]), __float_as_uint(values[5]), __float_as_uint(values[6]),
                     __float_as_uint(values[7]));
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        pointer[i] = values[i];
    }
  } else {
    unsigned short *pointer = static_cast<unsigned short *>(base) + offset;
    unsigned words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      words[i] = pack_pair<kType>(values[2 * i], values[2 * i + 1]);
    if constexpr (kVectorized) {
      store_16_bytes(pointer, words[0], words[1], words[2], words[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pointer[2 * i] = static_cast<unsigned short>(words[i]);
        pointer[2 * i + 1] = static_cast<unsigned short>(words[i] >> 16);
      }
    }
  }
}

__device__ __forceinline__ long long row_offset(const SageMergeRowStrides &strides, long long outer, long long middle,
                                                long long inner) {
  return outer * strides.outer + middle * strides.middle + inner * strides.inner;
}

// A row's (outer, middle, inner) indices. 32-bit divisions where every row number fits (a 64-bit division costs
// several times as many instructions, and every lane of a row does this).
__device__ __forceinline__ void split_row(const SageMergeParams &p, long long row, long long &outer, long long &middle,
                                          long long &inner) {
  if (p.rows <= 0xffffffffLL) {
    const unsigned r = static_cast<unsigned>(row), inner_size = static_cast<unsigned>(p.inner);
    const unsigned middle_size = static_cast<unsigned>(p.middle), rest = r / inner_size;
    inner = r - rest * inner_size;
    middle = rest % middle_size;
    outer = rest / middle_size;
  } else {
    const long long rest = row / p.inner;
    inner = row - rest * p.inner;
    middle = rest % p.middle;
    outer = rest / p.middle;
  }
}

// The two parts' weights in the merged row, e^(lse - L), and L itself. Exact zeros for a part at -inf; both at -inf:
// zero weights and L = -inf.
struct RowWeights {
  float a, b, lse;
};

__device__ __forceinline__ RowWeights row_weights(float lse_a, float lse_b) {
  const float minus_infinity = negative_infinity();
  const float top = fmaxf(lse_a, lse_b);
  if (top == minus_infinity)
    return {0.0f, 0.0f, minus_infinity};
  const float a = lse_a == minus_infinity ? 0.0f : expf(lse_a - top);
  const float b = lse_b == minus_infinity ? 0.0f : expf(lse_b - top);
  const float total = a + b; // in [1, 2]: the larger part's term is e^0
  return {a / total, b / total, top + logf(total)};
}

// Every row of the call, a warp's rows at a time (the loop is uniform over the warp: the shuffle needs every lane).
// The access width is a template parameter: one branch per launch, not per chunk (with a branch per chunk the
// compiler merges the two paths' stores and splits a 16-byte store).
template <int kTypeA, int kTypeB, int kTypeOut, bool kVectorized>
__device__ void merge_rows_with(const SageMergeParams &p) {
  const int lanes = p.lanes_per_row;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int group_lane = lane & (lanes - 1);
  const int rows_per_warp = 32 / lanes;
  const long long warp = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const long long warps = (static_cast<long long>(gridDim.x) * blockDim.x) >> 5;
  const int chunks = p.head_dim / SAGE_MERGE_CHUNK;
  for (long long first = warp * rows_per_warp; first < p.rows; first += warps * rows_per_warp) {
    const long long row = first + lane / lanes;
    const bool active = row < p.rows;
    long long outer = 0, middle = 0, inner = 0;
    if (active)
      split_row(p, row, outer, middle, inner);
    const long long base_a = row_offset(p.o_a_strides, outer, middle, inner);
    const long long base_b = row_offset(p.o_b_strides, outer, middle, inner);
    const long long base_out = row_offset(p.o_out_strides, outer, middle, inner);
    // The lane's first chunk is loaded before the weights arrive, so that its latency overlaps the LSEs' (a masked
    // part's values are loaded too, and left out by the selects below).
    float part_a[8], part_b[8];
    if (active && group_lane < chunks) {
      load_chunk<kTypeA, kVectorized>(p.o_a, base_a + group_lane * SAGE_MERGE_CHUNK, part_a);
      load_chunk<kTypeB, kVectorized>(p.o_b, base_b + group_lane * SAGE_MERGE_CHUNK, part_b);
    }
    RowWeights weights{0.0f, 0.0f, 0.0f};
    if (active && group_lane == 0)
      weights = row_weights(p.lse_a[row_offset(p.lse_a_strides, outer, middle, inner)],
                            p.lse_b[row_offset(p.lse_b_strides, outer, middle, inner)]);
    const float weight_a = __shfl_sync(0xffffffffu, weights.a, 0, lanes);
    const float weight_b = __shfl_sync(0xffffffffu, weights.b, 0, lanes);
    if (!active)
      continue;
    for (int chunk = group_lane; chunk < chunks; chunk += lanes) {
      const long long column = static_cast<long long>(chunk) * SAGE_MERGE_CHUNK;
      if (chunk != group_lane) { // rows wider than the lanes' first chunks (d > 256, or d > 8 x lanes)
        load_chunk<kTypeA, kVectorized>(p.o_a, base_a + column, part_a);
        load_chunk<kTypeB, kVectorized>(p.o_b, base_b + column, part_b);
      }
      // A weight of 0 (a masked part) selects 0 instead of multiplying: its values may be NaN.
      float merged[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float from_a = weight_a > 0.0f ? weight_a * part_a[i] : 0.0f;
        merged[i] = weight_b > 0.0f ? fmaf(weight_b, part_b[i], from_a) : from_a;
      }
      store_chunk<kTypeOut, kVectorized>(p.o_out, base_out + column, merged);
    }
    if (group_lane == 0)
      p.lse_out[row_offset(p.lse_out_strides, outer, middle, inner)] = weights.lse;
  }
}

// The kernel's body: the 16-byte path where the host found every pointer and row stride aligned, else elements.
template <int kTypeA, int kTypeB, int kTypeOut> __device__ void merge_rows(const SageMergeParams &p) {
  if (p.vectorized)
    merge_rows_with<kTypeA, kTypeB, kTypeOut, true>(p);
  else
    merge_rows_with<kTypeA, kTypeB, kTypeOut, false>(p);
}

} // namespace sage::device::merge
