// O in a consumer's registers: its rescaling by the online softmax, int8 P.V's per-block sums, two-level
// accumulation's outer sum, and the epilogue that writes O and the LSE.
#pragma once

#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/tiles.cuh"
#include "sage/device/sm90/warpgroup.cuh"

namespace sage::device::sm90 {

// O *= exp2(m_old - m_new), per row half (registers 4j + 2h, 4j + 2h + 1 of an f32 accumulator; 2j + h of f16x2).
template <int kCount> __device__ __forceinline__ void rescale_f32(float (&values)[kCount], const float (&rescale)[2]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    values[i] *= rescale[(i / 2) % 2];
}

template <int kCount>
__device__ __forceinline__ void rescale_f16x2(unsigned (&values)[kCount], const float (&rescale)[2]) {
  const unsigned factors[2] = {pack_f16x2(rescale[0], rescale[0]), pack_f16x2(rescale[1], rescale[1])};
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    values[i] = scale_f16x2(values[i], factors[i % 2]);
}

// Whether the P.V accumulator holds earlier blocks; if not, the next P.V restarts it (scale-d 0): the tile's first
// block, and two-level accumulation's first block after a flush.
template <class Config> __device__ __forceinline__ bool accumulates(const ConsumerState<Config> &state) {
  if constexpr (Config::kPv == PvOperands::int8)
    return false; // an s32 product per block
  else if constexpr (Config::kTwoLevel && Config::kFlushPeriod == 1)
    return false;
  else
    return state.blocks_since_flush != 0;
}

// O_i^(j-1) *= exp2(m^(j-1) - m^j) before P~_i^j V_j is added: the accumulator and the outer sum, both relative to m.
template <class Config>
__device__ __forceinline__ void rescale_output(ConsumerState<Config> &state, const float (&rescale)[2]) {
  if constexpr (ConsumerState<Config>::kFoldsRescale) { // applied by finish_block, in the product's add
    state.product_rescale[0] = rescale[0];
    state.product_rescale[1] = rescale[1];
    return;
  }
  // Multiplying by 1 changes nothing (bit for bit): once its rows' maxima stop growing, which is most blocks of a long
  // row, a warp skips the O x rescale it would issue for every accumulator register.
  if (!__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f))
    return;
  if constexpr (ConsumerState<Config>::kOuterSum)
    rescale_f32(state.flushed, rescale);
  if constexpr (Config::kPv != PvOperands::int8 && (!Config::kTwoLevel || Config::kFlushPeriod > 1)) {
    if (accumulates(state)) {
      if constexpr (ConsumerState<Config>::kF16Accumulator)
        rescale_f16x2(state.output, rescale);
      else
        rescale_f32(state.output, rescale);
    }
  }
}

// Element i of O's accumulator (not int8's: its blocks go straight into `flushed`) in f32; an f16 accumulator holds
// two per register.
template <class Config> __device__ __forceinline__ float output_value(const ConsumerState<Config> &state, int i) {
  if constexpr (ConsumerState<Config>::kF16Accumulator) {
    float low, high;
    unpack_f16x2(state.output[i / 2], low, high);
    return i % 2 == 0 ? low : high;
  } else {
    return state.output[i];
  }
}

// The accumulator added into the outer f32 sum (two-level accumulation's flush).
template <class Config> __device__ __forceinline__ void flush_output(ConsumerState<Config> &state) {
#pragma unroll
  for (int i = 0; i < Config::kHeadDim / 2; ++i) {
    state.flushed[i] += output_value(state, i);
  }
}

// After P~_i^j V_j has completed: int8 adds its s32 block product into the f32 sum; two-level accumulation adds the
// accumulator into the outer sum every kFlushPeriod blocks (the next block's P.V then restarts it). With a sliced
// fold the product is column slice `slice` of the block's (its registers start a whole 8-column tile further in the
// sum, so register i's row half is the same there).
template <class Config, int kProductRegisters>
__device__ __forceinline__ void finish_block(ConsumerState<Config> &state,
                                             const int (&block_product)[kProductRegisters], int slice = 0) {
  constexpr int kFolded = ConsumerState<Config>::kOutputChannels / 2; // f32 registers a fold adds
  const int first = slice * kFolded;
  if constexpr (Config::kPv == PvOperands::int8) {
#pragma unroll
    for (int i = 0; i < kFolded; ++i) // |P V| <= 128 x 127 x 127 < 2^22
      state.flushed[first + i] =
          fmaf(state.flushed[first + i], state.product_rescale[(i / 2) % 2], small_int_to_float(block_product[i]));
  } else if constexpr (ConsumerState<Config>::kFoldsRescale) {
#pragma unroll
    for (int i = 0; i < kFolded; ++i)
      state.flushed[first + i] =
          fmaf(state.flushed[first + i], state.product_rescale[(i / 2) % 2], output_value(state, i));
  } else if constexpr (Config::kTwoLevel) {
    if (++state.blocks_since_flush == Config::kFlushPeriod) {
      state.blocks_since_flush = 0;
      flush_output(state);
    }
  } else {
    state.blocks_since_flush = 1; // `output` holds the tile's blocks
  }
}

// O_i = diag(l_i)^-1 O_i (x delta_V x P's scale) (+ mean(V)) in the input's dtype, then the LSE.
template <class Config>
__device__ __forceinline__ void write_results(ConsumerState<Config> &state, const SageSm90AttentionParams &params,
                                              const TileCoordinates &loop_tile, const int (&rows)[2], int quad_lane) {
  const SageAttentionParams &base = params.base;
  const TileCoordinates tile = epilogue_tile<Config>(base, loop_tile);
  constexpr bool kCodes = Config::kPv == PvOperands::int8 || Config::kPv == PvOperands::e4m3;
  // O's element i in f32
  auto output_of = [&](int i) {
    float value;
    if constexpr (Config::kPv != PvOperands::int8 && !ConsumerState<Config>::kSlicedFold)
      value = output_value(state, i);
    if constexpr (Config::kPv == PvOperands::int8 || ConsumerState<Config>::kSlicedFold)
      value = state.flushed[i];           // (sliced: every block was folded; `output` holds one slice)
    else if constexpr (Config::kTwoLevel) // the outer sum and the blocks since its last flush, both relative to m
      value = accumulates(state) ? state.flushed[i] + value : state.flushed[i];
    else // `output` was never written when the tile visited no block
      value = accumulates(state) ? value : 0.0f;
    return value;
  };
  // Up to d = 128 all of O is converted first (the order the measured kernels have); beyond, each element where it is
  // written (an f16 O at d = 256 converted whole spilled 12 bytes with the LSE).
  constexpr bool kConvertFirst = Config::kHeadDim <= 128;
  float converted[kConvertFirst ? Config::kHeadDim / 2 : 1];
  if constexpr (kConvertFirst) {
#pragma unroll
    for (int i = 0; i < Config::kHeadDim / 2; ++i)
      converted[i] = output_of(i);
  }
  auto output = [&](int i) {
    if constexpr (kConvertFirst)
      return converted[i];
    else
      return output_of(i);
  };
  const unsigned char *workspace = base.workspace;
  const float *v_scales =
      reinterpret_cast<const float *>(workspace + base.offsets.v_scales) + tile.kv_head_index * Config::kHeadDim;
  const float *v_mean =
      reinterpret_cast<const float *>(workspace + base.offsets.v_mean) + tile.kv_head_index * Config::kHeadDim;
  // Packed: the batch stride is 0 and the sequence's rows start at q_base
  unsigned short *o = static_cast<unsigned short *>(base.o) + tile.batch * base.o_strides.batch +
                      tile.head * base.o_strides.head + tile.q_base * base.o_strides.token;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    state.row_sum[half] = quad_sum(state.row_sum[half]);
    const int row = rows[half];
    if (row >= tile.tokens_q)
      continue;
    const bool visible = state.row_sum[half] > 0.0f;
    const float inverse_sum = visible ? 1.0f / state.row_sum[half] : 0.0f;
#pragma unroll
    for (int tile_n = 0; tile_n < Config::kHeadDim / 8; ++tile_n) {
      const int channel = tile_n * 8 + quad_lane * 2;
      float low = output(tile_n * 4 + half * 2) * inverse_sum;
      float high = output(tile_n * 4 + half * 2 + 1) * inverse_sum;
      if constexpr (kCodes) {
        low *= v_scales[channel]; // psi_V^-1 (P's code scale is in l, which summed the codes' values)
        high *= v_scales[channel + 1];
      }
      if constexpr (Config::kSmoothedV) {
        if (visible) {
          low += v_mean[channel];
          high += v_mean[channel + 1];
        }
      }
      if constexpr (Config::kPackedSequences) { // an empty KV sequence: O = 0 whatever its (unused) V statistics hold
        low = visible ? low : 0.0f;
        high = visible ? high : 0.0f;
      }
      const unsigned packed = Config::kBf16 ? pack_bf16x2(low, high) : pack_f16x2(low, high);
      *reinterpret_cast<unsigned *>(o + row * base.o_strides.token + channel) = packed;
    }
  }
  if constexpr (Config::kWriteLse) {
    if (base.lse)
      write_lse<Config>(base, tile, rows, state.row_max, state.row_sum, quad_lane, Config::kProbabilityCodeLog2);
  }
}

} // namespace sage::device::sm90
