// SLA's mask prediction (Algorithm 1, lines 5-6) in two launches: the block means of Q and K, then P_c =
// softmax(pool(Q) pool(K)^T / sqrt(d)) for a few rows per CTA, each row ranked, classed and listed in its lookup
// tables by one warp.
#pragma once

#include "sage/device/sla/common.cuh"

namespace sage::device::sla {

// A row of P_c lives in shared memory: at most this many kv blocks (256k tokens at b_kv = 64).
constexpr int kMaxKvBlocks = 4096;
constexpr int kPredictKeys = SAGE_SLA_PREDICT_KEYS;
constexpr int kPredictMaxRows = SAGE_SLA_PREDICT_MAX_ROWS;
static_assert(kPredictKeys >= 2 * kMaxKvBlocks, "two rows of the widest P_c per CTA");

// Eight f16 (or bf16: kBf16) values (16 bytes) to f32.
template <bool kBf16> __device__ __forceinline__ void halves_to_floats(const uint4 &bits, float (&out)[8]) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if constexpr (kBf16) {
      out[2 * w] = __uint_as_float(words[w] << 16);
      out[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
    } else {
      asm("cvt.f32.f16 %0, %1;" : "=f"(out[2 * w]) : "h"(static_cast<unsigned short>(words[w] & 0xffffu)));
      asm("cvt.f32.f16 %0, %1;" : "=f"(out[2 * w + 1]) : "h"(static_cast<unsigned short>(words[w] >> 16)));
    }
  }
}

// Launch 1: the mean over the tokens of one block (a short last block averages what it has), channel by channel.
// Each thread reads 8 channels of a token with one 16-byte load (8 scalar loads where the tensor is not 16-byte
// aligned; the summation order is the same either way, so equal blocks pool to equal means). pool(K) is written
// transposed, [d][kv_blocks] per head, so that the prediction's threads (one kv block each) read it coalesced.
template <int D, int BLOCK_Q, int BLOCK_KV, bool kBf16> __device__ void pool_blocks(const SageSlaPoolParams &p) {
  constexpr int kChunkLanes = D / 8;                  // threads per token
  constexpr int kTokenLanes = kThreads / kChunkLanes; // tokens read at once
  static_assert(D % 8 == 0 && kThreads % kChunkLanes == 0, "D must be a multiple of 8 that divides the CTA by 8");
  __shared__ float partial[kTokenLanes][D + 1];
  const int b = blockIdx.z, h = blockIdx.y;
  int block = blockIdx.x;
  if (p.lse_saved != nullptr && block == 0 && h == 0 && b == 0 && threadIdx.x == 0)
    *p.lse_saved = p.lse_saved_value; // the first launch of every forward: whether this one saves L
  const bool is_q = block < p.shape.q_blocks;
  if (!is_q) {
    block -= p.shape.q_blocks;
    if (h >= p.shape.heads_kv)
      return;
  }
  const void *x = is_q ? p.q : p.k;
  const SageSlaStrides strides = is_q ? p.q_strides : p.k_strides;
  const int size = is_q ? BLOCK_Q : BLOCK_KV, tokens = is_q ? p.shape.tokens_q : p.shape.tokens_kv;
  const int begin = block * size, end = min(tokens, begin + size);
  const int chunk = threadIdx.x % kChunkLanes, token_lane = threadIdx.x / kChunkLanes, c0 = chunk * 8;
  const bool aligned = reinterpret_cast<unsigned long long>(x) % 16 == 0 && strides.batch % 8 == 0 &&
                       strides.head % 8 == 0 && strides.token % 8 == 0;
  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int t = begin + token_lane; t < end; t += kTokenLanes) {
    const long long index = element_index(strides, b, h, t, c0);
    float values[8];
    if (aligned) {
      halves_to_floats<kBf16>(__ldg(reinterpret_cast<const uint4 *>(static_cast<const unsigned short *>(x) + index)),
                              values);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        values[e] = load_element<kBf16>(x, index + e);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
      sum[e] += values[e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e)
    partial[token_lane][c0 + e] = sum[e];
  __syncthreads();
  const int used_lanes = min(kTokenLanes, end - begin);
  for (int c = threadIdx.x; c < D; c += kThreads) {
    float total = partial[0][c];
    for (int l = 1; l < used_lanes; ++l)
      total += partial[l][c];
    const float mean = total / static_cast<float>(end - begin);
    if (is_q)
      p.pooled_q[(static_cast<long long>(b * p.shape.heads_q + h) * p.shape.q_blocks + block) * D + c] = mean;
    else
      p.pooled_k[(static_cast<long long>(b * p.shape.heads_kv + h) * D + c) * p.shape.kv_blocks + block] = mean;
  }
}

// A logit as an unsigned key with the same order (and -0 as +0, so that equal logits give equal keys).
__device__ __forceinline__ unsigned order_key(float value) {
  const unsigned bits = __float_as_uint(value == 0.0f ? 0.0f : value);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

// Warp reductions of keys and counts (sm_80's redux: one instruction, not five shuffles).
__device__ __forceinline__ unsigned warp_max_key(unsigned key) { return __reduce_max_sync(0xffffffffu, key); }
__device__ __forceinline__ unsigned warp_min_key(unsigned key) { return __reduce_min_sync(0xffffffffu, key); }
__device__ __forceinline__ int warp_count(int count) { return __reduce_add_sync(0xffffffffu, count); }

// The logits of `rows` rows of P_c (consecutive q blocks of one head) against every kv block, as order keys in
// `keys` ([rows][kv_blocks]). A thread owns a kv block and accumulates all rows: pool(K)'s column is read once per
// CTA, coalesced, and the pooled Q rows are warp-uniform shared-memory reads. Each logit sums over the channels in
// order (fma, c = 0 .. D-1), as the CPU reference does (in double).
template <int D, int ROWS>
__device__ __forceinline__ void row_logits(const float *q_rows, const float *k_pool, int kv_blocks, float scale,
                                           unsigned *keys) {
  for (int j = threadIdx.x; j < kv_blocks; j += kThreads) {
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      acc[r] = 0.0f;
#pragma unroll 2
    for (int c = 0; c < D; c += 4) {
      float k[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        k[u] = __ldg(k_pool + static_cast<long long>(c + u) * kv_blocks + j);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float4 q = *reinterpret_cast<const float4 *>(q_rows + r * D + c);
        acc[r] = fmaf(q.x, k[0], acc[r]);
        acc[r] = fmaf(q.y, k[1], acc[r]);
        acc[r] = fmaf(q.z, k[2], acc[r]);
        acc[r] = fmaf(q.w, k[3], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      keys[r * kv_blocks + j] = order_key(acc[r] * scale);
  }
}

// The largest keys T with #{k : keys[k] >= T} >= count, for two counts at once, by one warp: the count-th largest key
// of each. Bits are decided from the highest one where the row's keys differ (those above are the row's common
// prefix), each with one pass over the row.
__device__ __forceinline__ void select_two(const unsigned *keys, int n, unsigned low, unsigned high, int count_a,
                                           int count_b, unsigned &t_a, unsigned &t_b) {
  const int lane = threadIdx.x % 32;
  const unsigned differ = low ^ high;
  t_a = t_b = low & ~(differ == 0 ? 0u : (0xffffffffu >> __clz(differ)));
  for (int bit = differ == 0 ? -1 : 31 - __clz(differ); bit >= 0; --bit) {
    const unsigned a = t_a | (1u << bit), b = t_b | (1u << bit);
    int above_a = 0, above_b = 0;
    for (int j = lane; j < n; j += 32) {
      const unsigned key = keys[j];
      above_a += key >= a ? 1 : 0;
      above_b += key >= b ? 1 : 0;
    }
    if (warp_count(above_a) >= count_a)
      t_a = a;
    if (warp_count(above_b) >= count_b)
      t_b = b;
  }
}

// One row of P_c by one warp: the softmax, the classes and the lookup tables. Ranks are by the logit descending, ties
// to the lower kv block (the CPU reference's order); the first critical_per_row ranks are critical, the last
// negligible_per_row negligible. With T_c the critical_per_row-th largest key, the critical blocks are those above
// T_c and the first (by index) of those equal to it; with T_n the negligible_per_row-th smallest, the negligible
// blocks are those below T_n and the last of those equal to it.
__device__ __forceinline__ void classify_row(const SageSlaPredictParams &p, const unsigned *keys, long long row) {
  const int lane = threadIdx.x % 32, n = p.shape.kv_blocks;
  const int critical = p.shape.critical_per_row, negligible = p.shape.negligible_per_row;
  unsigned low = 0xffffffffu, high = 0u;
  for (int j = lane; j < n; j += 32) {
    low = min(low, keys[j]);
    high = max(high, keys[j]);
  }
  low = warp_min_key(low);
  high = warp_max_key(high);
  const float row_max = key_value(high);
  float sum = 0.0f;
  for (int j = lane; j < n; j += 32)
    sum += expf(key_value(keys[j]) - row_max);
  sum = warp_sum(sum);

  // count_b = n - negligible + 1 > n when there are none: the search then ends at `low`, which nothing is below.
  unsigned t_critical, t_negligible;
  select_two(keys, n, low, high, max(critical, 1), n - negligible + 1, t_critical, t_negligible);
  int above_critical = 0, below_negligible = 0, at_negligible = 0;
  for (int j = lane; j < n; j += 32) {
    const unsigned key = keys[j];
    above_critical += key > t_critical ? 1 : 0;
    below_negligible += key < t_negligible ? 1 : 0;
    at_negligible += key == t_negligible ? 1 : 0;
  }
  // Of the keys equal to T_c, the first `critical - above` are critical; of those equal to T_n, the ones from ordinal
  // `at - (negligible - below)` on are negligible.
  const int critical_ties = critical - warp_count(above_critical);
  const int negligible_from =
      negligible == 0 ? n : warp_count(at_negligible) - (negligible - warp_count(below_negligible));

  const int marginal = n - critical - negligible;
  const bool majority = p.marginal_majority != 0;
  const long long base = row * n;
  int *critical_lut = p.critical_lut + row * critical;
  int *linear_lut = p.linear_lut + row * (majority ? n - marginal : marginal);
  const unsigned below_lane = (1u << lane) - 1u;
  int critical_seen = 0, negligible_seen = 0, critical_listed = 0, linear_listed = 0;
  for (int start = 0; start < n; start += 32) {
    const int j = start + lane;
    const bool valid = j < n;
    const unsigned key = valid ? keys[j] : 0u;
    const unsigned tie_c = __ballot_sync(0xffffffffu, valid && key == t_critical);
    const unsigned tie_n = __ballot_sync(0xffffffffu, valid && key == t_negligible);
    const bool is_critical =
        critical > 0 &&
        (key > t_critical || (key == t_critical && critical_seen + __popc(tie_c & below_lane) < critical_ties));
    const bool is_negligible =
        key < t_negligible || (key == t_negligible && negligible_seen + __popc(tie_n & below_lane) >= negligible_from);
    critical_seen += __popc(tie_c);
    negligible_seen += __popc(tie_n);
    const signed char cls = is_critical ? 1 : is_negligible ? -1 : 0;
    const bool listed_critical = valid && cls == 1, listed_linear = valid && (majority ? cls != 0 : cls == 0);
    const unsigned critical_ballot = __ballot_sync(0xffffffffu, listed_critical);
    const unsigned linear_ballot = __ballot_sync(0xffffffffu, listed_linear);
    if (valid) {
      p.compressed[base + j] = expf(key_value(key) - row_max) / sum;
      p.classes[base + j] = cls;
      p.critical_mask[base + j] = cls == 1 ? 1 : 0;
    }
    if (listed_critical)
      critical_lut[critical_listed + __popc(critical_ballot & below_lane)] = j;
    if (listed_linear)
      linear_lut[linear_listed + __popc(linear_ballot & below_lane)] = j;
    critical_listed += __popc(critical_ballot);
    linear_listed += __popc(linear_ballot);
  }
}

// Launch 2: sage_sla_predict_rows(kv_blocks) consecutive rows of P_c of one head per CTA: their logits into shared
// memory by all threads, then one warp per row.
template <int D, int ROWS>
__device__ __forceinline__ void predict_rows_of(const SageSlaPredictParams &p, float *q_rows, unsigned *keys) {
  const int b = blockIdx.z, h = blockIdx.y, first = blockIdx.x * ROWS;
  const int kv_blocks = p.shape.kv_blocks, h_kv = h / (p.shape.heads_q / p.shape.heads_kv);
  const int rows = min(ROWS, p.shape.q_blocks - first);
  const long long first_row = (static_cast<long long>(b) * p.shape.heads_q + h) * p.shape.q_blocks + first;
  for (int e = threadIdx.x; e < ROWS * D; e += kThreads)
    q_rows[e] = e < rows * D ? p.pooled_q[first_row * D + e] : 0.0f; // rows past q_blocks: computed, not used
  __syncthreads();
  const float *k_pool = p.pooled_k + (static_cast<long long>(b) * p.shape.heads_kv + h_kv) * D * kv_blocks;
  row_logits<D, ROWS>(q_rows, k_pool, kv_blocks, p.scale, keys);
  __syncthreads();
  for (int r = threadIdx.x / 32; r < rows; r += kWarps)
    classify_row(p, keys + r * kv_blocks, first_row + r);
}

// Shared memory: 32 KiB of keys and up to 16 pooled Q rows (8 KiB at d = 128), under the 48 KiB of static shared
// memory every arch gives.
template <int D> __device__ void predict_rows(const SageSlaPredictParams &p) {
  static_assert(kPredictMaxRows == 16, "the dispatch below covers 16, 8, 4 and 2 rows");
  __shared__ __align__(16) float q_rows[kPredictMaxRows * D];
  __shared__ unsigned keys[kPredictKeys];
  switch (sage_sla_predict_rows(p.shape.kv_blocks)) {
  case 16:
    return predict_rows_of<D, 16>(p, q_rows, keys);
  case 8:
    return predict_rows_of<D, 8>(p, q_rows, keys);
  case 4:
    return predict_rows_of<D, 4>(p, q_rows, keys);
  default:
    return predict_rows_of<D, 2>(p, q_rows, keys);
  }
}

} // namespace sage::device::sla
