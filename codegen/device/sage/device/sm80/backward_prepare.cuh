// SageBwd's preprocess and write_dq launches (issue 12), shared by the mma.sync and the wgmma backward
// (sm80/backward.cuh describes the launches and the workspace they share):
//   k_sums        (K smoothing only, issue 25) K's column sums over a slice of each KV head's tokens.
//   preprocess_q  psi(Q_i) and psi(dO_i), int8 with one scale per 64-token block, natural and transposed; the row
//                 stats L log2(e) and D_i = rowsum(dO_i o O_i); dq_accum zeroed. With K smoothing, L is the LSE
//                 shifted by q . mean(K) / sqrt(d) (q the caller's row), the LSE of the scores S_s = Q (K - mean(K))^T.
//   preprocess_k  psi(K_j), natural and transposed; of K_j - mean(K) with K smoothing.
//   write_dq      dq_accum -> dQ in the input type.
// With the rotation (issue 25, Config::kRotate: backward_rotation.cuh) the preprocess quantizes Q R_Q and K R_K (K
// after smoothing; the LSE shift takes the caller's q, before its rotation) and write_dq rotates dQ back by R_K^-1.
// Memory-bound: each thread reads its 8-element pieces once with 16-byte loads and keeps them in registers. K
// smoothing adds one read of K (k_sums) and, per preprocess CTA, one of the slices' sums (min(8, blocks) x d floats).
#pragma once

#include "sage/device/sm80/backward_params.cuh"
#include "sage/device/sm80/backward_rotation.cuh"
#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/shared_tiles.cuh"

namespace sage::device::sm80::backward {

using sm90::decode_input_element;
using sm90::negative_infinity;
using sm90::pack_bf16x2;
using sm90::pack_f16x2;

constexpr int kBlock = 64; // b_q = b_kv: the P/dS tile and the scale blocks of Q, K, dO
constexpr int kWarps = 4;  // of the preprocess and write_dq kernels
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;

// The maximum of `value` over the CTA (`scratch`: kWarps floats). Synchronizes the CTA twice.
__device__ __forceinline__ float block_max(float value, float *scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  if ((threadIdx.x & 31) == 0)
    scratch[threadIdx.x >> 5] = value;
  __syncthreads();
  float result = scratch[0];
  for (int w = 1; w < kWarps; ++w)
    result = fmaxf(result, scratch[w]);
  __syncthreads();
  return result;
}

// What quantize_block does with mean(K) (Config::kSmoothK): nothing; subtract it from every valid token (K_j -
// mean(K), padding stays zero); or dot each token with it (q . mean(K) per row of a Q block, for the LSE shift).
enum class MeanUse { none, subtract, row_dot };

// Whether quantize_block rotates each token (after subtracting mean(K)) before psi: by R_Q, by R_K, or not.
enum class Rotation { none, q, k };

// psi's code: cvt.rni of x * inverse, saturated to [-127, 127] (numerics::roundToInt8; NaN gives 0).
__device__ __forceinline__ signed char int8_code(float x, float inverse) {
  const int code = __float2int_rn(x * inverse);
  return static_cast<signed char>(code > 127 ? 127 : (code < -127 ? -127 : code));
}

// numerics::symmetricScale(amax, 127): scale amax / 127 and inverse 127 / amax in f32, 0 and 0 for amax 0.
__device__ __forceinline__ void int8_scale(float amax, float &scale, float &inverse) {
  scale = amax / 127.0f;
  inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
}

// The wgmma main kernel's shared-memory tiles of one 64-token block that the preprocess also writes to global memory
// in their byte order (Config::kBulkTiles): Q^ [64][d] int8, dO [64][d] 16-bit, Q^^T and dO^^T [d][64] int8.
template <int kHeadDim> struct BulkTiles {
  using Q = sm90::SwizzledTile<kBlock, kHeadDim>;
  using Do = sm90::SwizzledTile<kBlock, 2 * kHeadDim>;
  using Transposed = sm90::SwizzledTile<kHeadDim, kBlock>;
};

template <bool kBf16> __device__ __forceinline__ unsigned pack_output(float low, float high) {
  if constexpr (kBf16)
    return pack_bf16x2(low, high);
  else
    return pack_f16x2(low, high);
}

// Eight consecutive elements of the caller's f16/bf16 tensor, zeros where `valid` is false: one 16-byte load where
// `aligned` (the tensor's base is 16-byte aligned, as the caching allocators give), eight 2-byte ones otherwise.
__device__ __forceinline__ uint4 load_eight_bits(const unsigned short *source, bool valid, bool aligned) {
  if (!valid)
    return make_uint4(0u, 0u, 0u, 0u);
  if (aligned)
    return *reinterpret_cast<const uint4 *>(source);
  unsigned words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    words[j] = static_cast<unsigned>(source[2 * j]) | static_cast<unsigned>(source[2 * j + 1]) << 16;
  return make_uint4(words[0], words[1], words[2], words[3]);
}

template <bool kBf16> __device__ __forceinline__ void decode_eight(uint4 bits, float (&out)[8]) {
  const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[2 * j] = decode_input_element<kBf16>(static_cast<unsigned short>(words[j] & 0xffffu));
    out[2 * j + 1] = decode_input_element<kBf16>(static_cast<unsigned short>(words[j] >> 16));
  }
}

// Four int8 codes as one 32-bit word, `first` at the lowest address.
__device__ __forceinline__ unsigned code_word(signed char first, signed char second, signed char third,
                                              signed char fourth) {
  return static_cast<unsigned>(static_cast<unsigned char>(first)) |
         static_cast<unsigned>(static_cast<unsigned char>(second)) << 8 |
         static_cast<unsigned>(static_cast<unsigned char>(third)) << 16 |
         static_cast<unsigned>(static_cast<unsigned char>(fourth)) << 24;
}

// row_dot[t] = the dot of token t's values with `mean`, from the piece of channels c .. c + 7 this lane holds: a row's
// pieces lie on kPiecesPerRow consecutive lanes of one warp, whose partial dots are added across them.
template <int kPiecesPerRow>
__device__ __forceinline__ void store_row_dot(const float (&values)[8], const float *mean, int t, int c,
                                              float *row_dot) {
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j)
    dot = fmaf(values[j], mean[c + j], dot);
#pragma unroll
  for (int offset = kPiecesPerRow / 2; offset > 0; offset >>= 1)
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (c == 0)
    row_dot[t] = dot;
}

// psi of one 64-token block of a head: one int8 scale for its 64 x head_dim values (zeros beyond `tokens`).
// Writes the codes natural ([token][channel], when `codes` is given) and transposed ([channel][token] per block);
// kWgmmaTokenOrder: the transposed rows hold each 32-token group in the order of an 8-bit wgmma A fragment packed
// from accumulator columns (sm90/backward.cuh), position p holding token accumulator_token_of_k_position(p).
// kBulkLayout: each block's codes in the byte order of BulkTiles' Q and Transposed tiles, and (when `raw` is
// given) the block's input elements as they are into `raw` in BulkTiles' Do order.
// Each thread reads its 8-element pieces once, with 16-byte loads, and keeps them in registers from the maximum to
// the codes (2-byte loads, each element read twice: preprocess_k took 115 us instead of 65 at N = 4k, b = 4, h = 16).
// kMean (with `mean`, kHeadDim floats of shared memory): subtract mean(K) first, or write each token's dot with it
// into `row_dot` (kBlock floats of shared memory; the barrier before the transposed codes publishes it).
// kRotation: quantize x R_Q or x R_K (backward_rotation.cuh) instead of x; row_dot still dots the unrotated x.
template <class Config, bool kWgmmaTokenOrder, bool kBulkLayout, MeanUse kMean = MeanUse::none,
          Rotation kRotation = Rotation::none>
__device__ void quantize_block(const unsigned short *head, int tokens, int block, signed char *codes,
                               signed char *codes_t, unsigned short *raw, float *scales, float *scratch,
                               [[maybe_unused]] const float *mean = nullptr,
                               [[maybe_unused]] float *row_dot = nullptr) {
  constexpr int kHeadDim = Config::kHeadDim, kStagedRow = kHeadDim + 4;
  constexpr int kPiecesPerRow = kHeadDim / 8, kPieces = kBlock * kPiecesPerRow / kThreads;
  static_assert(kBlock * kPiecesPerRow % kThreads == 0, "every thread quantizes the same number of pieces");
  static_assert(32 % kPiecesPerRow == 0, "a row's pieces lie on consecutive lanes of one warp");
  using Tiles = BulkTiles<kHeadDim>;
  // This block's codes [token][channel]. Shared by successive calls: block_max's barriers order a call's writes after
  // the previous call's reads.
  __shared__ __align__(16) signed char staged[kBlock * kStagedRow];
  const int token0 = block * kBlock;
  const long long block_elements = static_cast<long long>(block) * kBlock * kHeadDim;
  const bool aligned = reinterpret_cast<unsigned long long>(head) % 16 == 0;
  float values[kPieces][8];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int piece = static_cast<int>(threadIdx.x) + i * kThreads;
    const int t = piece / kPiecesPerRow, c = piece % kPiecesPerRow * 8;
    const uint4 bits =
        load_eight_bits(head + static_cast<long long>(token0 + t) * kHeadDim + c, token0 + t < tokens, aligned);
    if (kBulkLayout && raw) // whole blocks of the workspace, 16-byte aligned
      *reinterpret_cast<uint4 *>(reinterpret_cast<unsigned char *>(raw + block_elements) +
                                 Tiles::Do::offset(t, 2 * c)) = bits;
    decode_eight<Config::kBf16>(bits, values[i]);
    if constexpr (kMean == MeanUse::subtract) {
      if (token0 + t < tokens)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          values[i][j] = __fsub_rn(values[i][j], mean[c + j]); // one f32 subtraction, as the reference
    }
    if constexpr (kRotation != Rotation::none) {
      if constexpr (kMean == MeanUse::row_dot) // the LSE shift dots the caller's q, before its rotation
        store_row_dot<kPiecesPerRow>(values[i], mean, t, c, row_dot);
      rotate_piece<Config, kRotation == Rotation::k>(values[i], c); // padding rows are zeros and stay zeros
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
      amax = fmaxf(amax, fabsf(values[i][j]));
  }
  amax = block_max(amax, scratch);
  float scale, inverse;
  int8_scale(amax, scale, inverse);
#pragma unroll
  for (int i = 0; i < kPieces; ++i) {
    const int piece = static_cast<int>(threadIdx.x) + i * kThreads;
    const int t = piece / kPiecesPerRow, c = piece % kPiecesPerRow * 8;
    signed char piece_codes[8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
      piece_codes[j] = int8_code(values[i][j], inverse);
    if constexpr (kMean == MeanUse::row_dot && kRotation == Rotation::none) // where the values are read last
      store_row_dot<kPiecesPerRow>(values[i], mean, t, c, row_dot);
    const unsigned low = code_word(piece_codes[0], piece_codes[1], piece_codes[2], piece_codes[3]);
    const unsigned high = code_word(piece_codes[4], piece_codes[5], piece_codes[6], piece_codes[7]);
    if (codes) // whole blocks of the workspace: 8-byte aligned (8 bytes stay within one swizzled 16-byte unit)
      *reinterpret_cast<uint2 *>(codes + block_elements + (kBulkLayout ? Tiles::Q::offset(t, c) : t * kHeadDim + c)) =
          make_uint2(low, high);
    *reinterpret_cast<unsigned *>(staged + t * kStagedRow + c) = low; // rows of 4-byte multiples
    *reinterpret_cast<unsigned *>(staged + t * kStagedRow + c + 4) = high;
  }
  __syncthreads();
  // The transposed codes from shared memory, four tokens of one channel per 32-bit store, consecutive threads on
  // consecutive words (written straight from the loop above, each byte went to its own 32-byte sector). Rows of
  // kHeadDim + 4 bytes: the tokens a warp reads in one channel lie in different banks.
  for (int e = static_cast<int>(threadIdx.x); e < kBlock * kHeadDim / 4; e += kThreads) {
    const int c = e / (kBlock / 4), position = e % (kBlock / 4) * 4;
    signed char four[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int p_j = position + j;
      const int t = kWgmmaTokenOrder ? p_j / 32 * 32 + sm90::accumulator_token_of_k_position(p_j % 32) : p_j;
      four[j] = staged[t * kStagedRow + c];
    }
    *reinterpret_cast<unsigned *>(codes_t + block_elements +
                                  (kBulkLayout ? Tiles::Transposed::offset(c, position) : 4 * e)) =
        code_word(four[0], four[1], four[2], four[3]);
  }
  if (threadIdx.x == 0)
    scales[block] = scale;
}

// K smoothing's slices of a KV head (k_sums): min(Config::kKMeanSlices, its 64-token blocks), each a run of whole
// blocks (the last ones may be empty). The host launches k_sums over the same count (BackwardGrid::kv_slices).
template <class Config> __device__ __forceinline__ int k_mean_slices(int tokens_kv) {
  const int blocks = (tokens_kv + kBlock - 1) / kBlock;
  return blocks < Config::kKMeanSlices ? blocks : Config::kKMeanSlices;
}

// k_sums: the column sums of K over slice blockIdx.x of KV head (blockIdx.z, blockIdx.y), in f32 with a fixed order
// (so mean(K) is the same in every run). Each thread sums 8 channels of every kRowsPerPass-th row, kUnroll loads in
// flight; then channel c's kRowsPerPass partial sums are added in row order.
template <class Config> __device__ void k_sums(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim, kPiecesPerRow = kHeadDim / 8, kRowsPerPass = kThreads / kPiecesPerRow;
  constexpr int kUnroll = 4;
  __shared__ float partials[kRowsPerPass][kHeadDim];
  const int slices = k_mean_slices<Config>(p.tokens_kv), blocks = (p.tokens_kv + kBlock - 1) / kBlock;
  const int per_slice = (blocks + slices - 1) / slices;
  const long long slice_tokens = static_cast<long long>(per_slice) * kBlock;
  const int begin = static_cast<int>(min(static_cast<long long>(p.tokens_kv), blockIdx.x * slice_tokens));
  const int end = static_cast<int>(min(static_cast<long long>(p.tokens_kv), begin + slice_tokens));
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const auto *k = static_cast<const unsigned short *>(p.k) + head * p.tokens_kv * kHeadDim;
  const bool aligned = reinterpret_cast<unsigned long long>(k) % 16 == 0;
  const int row = threadIdx.x / kPiecesPerRow, c = threadIdx.x % kPiecesPerRow * 8;
  float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  for (int t = begin + row; t < end; t += kRowsPerPass * kUnroll) {
    uint4 bits[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int token = t + u * kRowsPerPass;
      bits[u] = load_eight_bits(k + static_cast<long long>(token) * kHeadDim + c, token < end, aligned);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float values[8];
      decode_eight<Config::kBf16>(bits[u], values); // zeros beyond the slice: adding them is exact
#pragma unroll
      for (int j = 0; j < 8; ++j)
        sum[j] = __fadd_rn(sum[j], values[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j)
    partials[row][c + j] = sum[j];
  __syncthreads();
  for (int channel = threadIdx.x; channel < kHeadDim; channel += kThreads) {
    float total = 0.0f;
    for (int r = 0; r < kRowsPerPass; ++r)
      total = __fadd_rn(total, partials[r][channel]);
    p.k_sums[(head * slices + blockIdx.x) * kHeadDim + channel] = total;
  }
}

// mean(K) of KV head `head_kv` (batch index * heads_kv + head) into `mean` (kHeadDim floats of shared memory): the
// slices' sums added in slice order, one f32 division. Synchronizes the CTA.
template <class Config> __device__ void load_k_mean(const SageBackwardParams &p, long long head_kv, float *mean) {
  const int slices = k_mean_slices<Config>(p.tokens_kv);
  for (int c = threadIdx.x; c < Config::kHeadDim; c += kThreads) {
    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice)
      sum = __fadd_rn(sum, p.k_sums[(head_kv * slices + slice) * Config::kHeadDim + c]);
    mean[c] = __fdiv_rn(sum, static_cast<float>(p.tokens_kv));
  }
  __syncthreads();
}

template <class Config> __device__ void preprocess_q(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim, kPerLane = kHeadDim / 32;
  static_assert(kPerLane == 2 || kPerLane == 4, "a row is 32 lanes of 2 or 4 elements");
  __shared__ float scratch[kWarps];
  const int block = blockIdx.x, blocks = (p.tokens_q + kBlock - 1) / kBlock;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_q + blockIdx.y;
  const long long head_elements = head * p.tokens_q * kHeadDim, head_codes = head * blocks * kBlock * kHeadDim;
  const auto *q = static_cast<const unsigned short *>(p.q) + head_elements;
  const auto *d_o = static_cast<const unsigned short *>(p.d_o) + head_elements;
  const auto *o = static_cast<const unsigned short *>(p.o) + head_elements;
  // {s_Q, Q^_i} = psi(Q_i), {s_dO, dO^_i} = psi(dO_i) (Algorithm 3, line 6); with K smoothing also q . mean(K) per row
  // of the block, from the Q values the quantizer holds (mean(K) of this query head's KV head)
  [[maybe_unused]] __shared__ float k_mean[Config::kSmoothK ? kHeadDim : 1], q_dot_mean[Config::kSmoothK ? kBlock : 1];
  constexpr Rotation kQRotation = Config::kRotate ? Rotation::q : Rotation::none; // psi(Q_i R_Q)
  if constexpr (Config::kSmoothK) {
    load_k_mean<Config>(p, static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y / (p.heads_q / p.heads_kv),
                        k_mean);
    quantize_block<Config, Config::kWgmmaQueryOrder, Config::kBulkTiles, MeanUse::row_dot, kQRotation>(
        q, p.tokens_q, block, p.q_codes + head_codes, p.q_codes_t + head_codes, nullptr, p.q_scales + head * blocks,
        scratch, k_mean, q_dot_mean);
  } else {
    quantize_block<Config, Config::kWgmmaQueryOrder, Config::kBulkTiles, MeanUse::none, kQRotation>(
        q, p.tokens_q, block, p.q_codes + head_codes, p.q_codes_t + head_codes, nullptr, p.q_scales + head * blocks,
        scratch);
  }
  quantize_block<Config, Config::kWgmmaQueryOrder, Config::kBulkTiles>(
      d_o, p.tokens_q, block, nullptr, p.do_codes_t + head_codes,
      Config::kBulkTiles ? p.do_tiles + head_codes : nullptr, p.do_scales + head * blocks, scratch);
  // The row stats: L log2(e) and D_i = rowsum(dO_i o O_i) (line 2), one warp per row, for the whole block (rows
  // beyond the end and rows without a visible key get +inf, so that `main` computes P = 0 for them unchecked); dQ's
  // f32 sum starts at zero. Lane l holds channels kPerLane l ..: one 4- or 8-byte load per tensor where aligned.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool aligned = (reinterpret_cast<unsigned long long>(d_o) | reinterpret_cast<unsigned long long>(o)) % 8 == 0;
  const float positive_infinity = __int_as_float(0x7f800000);
  for (int row = warp; row < kBlock; row += kWarps) {
    const int token = block * kBlock + row;
    const long long padded_row = head * blocks * kBlock + token;
    float sum = 0.0f, lse_log2 = positive_infinity;
    if (token < p.tokens_q) {
      const long long first = static_cast<long long>(token) * kHeadDim + kPerLane * lane;
      unsigned short d_o_bits[kPerLane], o_bits[kPerLane];
      if (aligned && kPerLane == 4) {
        const uint2 a = *reinterpret_cast<const uint2 *>(d_o + first), b = *reinterpret_cast<const uint2 *>(o + first);
        const unsigned a_words[2] = {a.x, a.y}, b_words[2] = {b.x, b.y};
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          d_o_bits[j] = static_cast<unsigned short>(a_words[j / 2] >> (16 * (j % 2)));
          o_bits[j] = static_cast<unsigned short>(b_words[j / 2] >> (16 * (j % 2)));
        }
      } else if (aligned) {
        const unsigned a = *reinterpret_cast<const unsigned *>(d_o + first);
        const unsigned b = *reinterpret_cast<const unsigned *>(o + first);
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          d_o_bits[j] = static_cast<unsigned short>(a >> (16 * (j % 2)));
          o_bits[j] = static_cast<unsigned short>(b >> (16 * (j % 2)));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          d_o_bits[j] = d_o[first + j];
          o_bits[j] = o[first + j];
        }
      }
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
        sum += decode_input_element<Config::kBf16>(d_o_bits[j]) * decode_input_element<Config::kBf16>(o_bits[j]);
      for (int offset = 16; offset > 0; offset >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      const float lse = p.lse[head * p.tokens_q + token];
      if (lse != negative_infinity()) {
        if constexpr (Config::kSmoothK) // S_s = S - q . mean(K): its LSE is LSE - q . mean(K) / sqrt(d)
          lse_log2 = (lse - q_dot_mean[row] * p.softmax_scale) * kLog2e;
        else
          lse_log2 = lse * kLog2e;
      }
    }
    if (lane == 0) {
      p.row_stats[2 * padded_row] = lse_log2;
      p.row_stats[2 * padded_row + 1] = sum;
    }
    float *dq_row = p.dq_accum + padded_row * kHeadDim + kPerLane * lane;
    if constexpr (kPerLane == 4)
      *reinterpret_cast<float4 *>(dq_row) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    else
      *reinterpret_cast<float2 *>(dq_row) = make_float2(0.0f, 0.0f);
  }
}

template <class Config> __device__ void preprocess_k(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim;
  __shared__ float scratch[kWarps];
  const int blocks = (p.tokens_kv + kBlock - 1) / kBlock;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_kv + blockIdx.y;
  const long long head_codes = head * blocks * kBlock * kHeadDim;
  const auto *k = static_cast<const unsigned short *>(p.k) + head * p.tokens_kv * kHeadDim;
  // {s_K, K^_j} = psi(K_j), of K_j - mean(K) with K smoothing (SageAttention's gamma, issue 25), of that times R_K
  // with the rotation
  constexpr Rotation kKRotation = Config::kRotate ? Rotation::k : Rotation::none;
  if constexpr (Config::kSmoothK) {
    __shared__ float k_mean[kHeadDim];
    load_k_mean<Config>(p, head, k_mean);
    quantize_block<Config, false, false, MeanUse::subtract, kKRotation>(
        k, p.tokens_kv, blockIdx.x, p.k_codes + head_codes, p.k_codes_t + head_codes, nullptr,
        p.k_scales + head * blocks, scratch, k_mean);
  } else {
    quantize_block<Config, false, false, MeanUse::none, kKRotation>(k, p.tokens_kv, blockIdx.x, p.k_codes + head_codes,
                                                                    p.k_codes_t + head_codes, nullptr,
                                                                    p.k_scales + head * blocks, scratch);
  }
}

// Where dq_accum keeps element (row, channel) of a head's rows: natural, or (Config::kSwizzledDqAccum, the wgmma
// kernel's bulk reductions from a bank-conflict-free shared tile) with each row's 16-byte units XORed by row % 8.
template <class Config> __device__ __forceinline__ int dq_accum_column(int row, int channel) {
  if constexpr (Config::kSwizzledDqAccum)
    return ((channel >> 2) ^ (row & 7)) << 2 | (channel & 3);
  else
    return channel;
}

// write_dq with the rotation: dQ = dq_accum R_K^-1. A row's 8-channel pieces on kHeadDim / 8 consecutive lanes (for
// the butterflies' shuffles); every lane runs every pass (rows beyond tokens_q are dq_accum's zero padding, unstored).
template <class Config> __device__ void write_unrotated_dq(const SageBackwardParams &p) {
  constexpr int kHeadDim = Config::kHeadDim, kLanes = kRotationLanes<Config>, kRowsPerPass = kThreads / kLanes;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_q + blockIdx.y;
  const long long padded_q = static_cast<long long>((p.tokens_q + kBlock - 1) / kBlock) * kBlock;
  const int channel = static_cast<int>(threadIdx.x) % kLanes * 8;
  auto *d_q = static_cast<unsigned *>(p.d_q);
#pragma unroll
  for (int pass = 0; pass < kBlock / kRowsPerPass; ++pass) {
    const int token = blockIdx.x * kBlock + pass * kRowsPerPass + static_cast<int>(threadIdx.x) / kLanes;
    const float *row = p.dq_accum + (head * padded_q + token) * kHeadDim;
    const float4 low = *reinterpret_cast<const float4 *>(row + dq_accum_column<Config>(token, channel));
    const float4 high = *reinterpret_cast<const float4 *>(row + dq_accum_column<Config>(token, channel + 4));
    float x[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    unrotate_piece<Config, true>(x, channel);
    if (token < p.tokens_q) {
      const uint4 words = pack_eight<Config::kBf16>(x);
      unsigned *out = d_q + ((head * p.tokens_q + token) * kHeadDim + channel) / 2;
      out[0] = words.x, out[1] = words.y, out[2] = words.z, out[3] = words.w;
    }
  }
}

template <class Config> __device__ void write_dq(const SageBackwardParams &p) {
  if constexpr (Config::kRotate) {
    write_unrotated_dq<Config>(p);
    return;
  }
  constexpr int kHeadDim = Config::kHeadDim;
  const long long head = static_cast<long long>(blockIdx.z) * p.heads_q + blockIdx.y;
  const long long padded_q = static_cast<long long>((p.tokens_q + kBlock - 1) / kBlock) * kBlock;
  const int token0 = blockIdx.x * kBlock;
  auto *d_q = static_cast<unsigned *>(p.d_q);
  for (int e = threadIdx.x; e < kBlock * kHeadDim / 2; e += kThreads) {
    const int token = token0 + e / (kHeadDim / 2), channel = 2 * (e % (kHeadDim / 2));
    if (token >= p.tokens_q)
      break;
    const long long index = (head * padded_q + token) * kHeadDim + dq_accum_column<Config>(token, channel);
    d_q[((head * p.tokens_q + token) * kHeadDim + channel) / 2] =
        pack_output<Config::kBf16>(p.dq_accum[index], p.dq_accum[index + 1]);
  }
}

} // namespace sage::device::sm80::backward
