// The sm120 FP4 attention kernel (SageAttention3, Algorithm 1) on the block-scaled mma.sync of sm_120: one CTA per
// (Q block, head, batch), each warp owning 16 Q rows, K_j/V_j in a cp.async pipeline of Config::kStages stages.
// The generated kernel (codegen/src/sm120/Sm120KernelWriter.cpp) defines a Config and calls attention_kernel.
//
// Workspace (codegen/README.md, "FP4 operands"): e2m1 codes two per byte (element 2k in the low nibble of byte k),
// one scale byte per kScaleGroup elements along each matmul's reduction axis:
//   q_codes [b, h_q, padded_q, d/2], q_scales [b, h_q, padded_q, d/G]   (Q smoothed per Q block, scale folded)
//   k_codes [b, h_kv, padded_kv, d/2], k_scales [b, h_kv, padded_kv, d/G] (natural token order)
//   v_codes [b, h_kv, d, padded_kv/2], v_scales [b, h_kv, d, padded_kv/G] (V^T: tokens along k)
//   delta_s f32 [b, h_q, padded_q / variant block_q, padded_kv]           (Q smoothing's GEMV, padding 0)
#pragma once

#include "sage/device/sm120/fragments.cuh"
#include "sage/device/sm120/instructions.cuh"
#include "sage/device/sm90/common.cuh"

namespace sage::device::sm120 {

using sm90::decode_input_element;
using sm90::fast_exp2;
using sm90::fast_log2;
using sm90::negative_infinity;
using sm90::pack_bf16x2;
using sm90::pack_f16x2;
using sm90::quad_max;
using sm90::quad_sum;

constexpr int kMmaK = 64;                // k of one m16n8k64: 32 bytes of codes per row
constexpr float kTwoLevelRange = 2688.f; // 448 x 6: the largest UE4M3 scale times the largest e2m1 value

__host__ __device__ constexpr int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// Mirrors Sm120Schedule's layoutSharedMemory (a static_assert in the generated kernel ties them): Q_i's codes and
// scales, then kStages x (K_j codes, K_j scales, V_j^T codes, V_j^T scales, delta_s of the block). Code rows are
// padded by 16 bytes, so the eight rows one fragment load touches (stride 48 or 80 bytes) fall into distinct banks.
// Every row of a CTA lies in one Q-smoothing block (the schedule's block_q divides the variant's), so a KV block
// needs one delta_s row of kBlockKv floats, shared by all warps.
template <class Config> struct SharedLayout {
  static constexpr int kCodeRowBytes = Config::kHeadDim / 2;
  static constexpr int kCodePitch = kCodeRowBytes + 16;
  static constexpr int kScaleRowBytes = Config::kHeadDim / Config::kScaleGroup;
  static constexpr int kValueRowBytes = Config::kBlockKv / 2;
  static constexpr int kValuePitch = kValueRowBytes + 16;
  static constexpr int kValueScaleRowBytes = Config::kBlockKv / Config::kScaleGroup;
  static constexpr int kQCodes = 0;
  static constexpr int kQScales = Config::kBlockQ * kCodePitch;
  static constexpr int kStageOffset = align16(kQScales + Config::kBlockQ * kScaleRowBytes);
  static constexpr int kKCodes = 0; // within a stage
  static constexpr int kKScales = Config::kBlockKv * kCodePitch;
  static constexpr int kVCodes = align16(kKScales + Config::kBlockKv * kScaleRowBytes);
  static constexpr int kVScales = kVCodes + Config::kHeadDim * kValuePitch;
  static constexpr int kDeltaS = align16(kVScales + Config::kHeadDim * kValueScaleRowBytes);
  static constexpr int kStageBytes = align16(kDeltaS + (Config::kDeltaS ? Config::kBlockKv * 4 : 0));
  static constexpr int kDynamicBytes = kStageOffset + Config::kStages * kStageBytes;
};

// The scales of one k64 step as the mma's scale operand: four UE4M3 bytes (NVFP4) or two UE8M0 bytes (MXFP4).
template <class Config> __device__ __forceinline__ unsigned load_scales(const unsigned char *shared) {
  if constexpr (Config::kScaleGroup == 16)
    return *reinterpret_cast<const unsigned *>(shared);
  else
    return *reinterpret_cast<const unsigned short *>(shared);
}

template <class Config>
__device__ __forceinline__ void block_scaled_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                                 unsigned scale_a, unsigned scale_b) {
  if constexpr (Config::kScaleGroup == 16)
    mma_nvfp4(d, a, b0, b1, scale_a, scale_b);
  else
    mma_mxfp4(d, a, b0, b1, scale_a, scale_b);
}

struct Tile {
  int q_block, head, batch, kv_head;
  int q_begin;
  long long q_head_index, kv_head_index;
  int block_end;        // KV blocks [0, block_end) are visited
  const float *delta_s; // Q smoothing: the delta_s row [padded_kv] of this CTA's Q block, else null
  int tokens_q, q_base; // the LSE's rows (sm90::write_lse): the call's (no packed sequences on this schedule)
};

template <class Config> __device__ __forceinline__ Tile tile_of(const SageAttentionParams &params) {
  const SageProblemSize &size = params.size;
  Tile tile;
  tile.q_block = Config::kReverseQBlocks ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  tile.head = blockIdx.y;
  tile.batch = blockIdx.z;
  tile.kv_head = tile.head / (size.heads_q / size.heads_kv);
  tile.q_begin = tile.q_block * Config::kBlockQ;
  tile.q_head_index = static_cast<long long>(tile.batch) * size.heads_q + tile.head;
  tile.kv_head_index = static_cast<long long>(tile.batch) * size.heads_kv + tile.kv_head;
  const int kv_blocks = (size.tokens_kv + Config::kBlockKv - 1) / Config::kBlockKv;
  tile.block_end = kv_blocks;
  tile.delta_s = nullptr;
  tile.tokens_q = size.tokens_q;
  tile.q_base = 0;
  if constexpr (Config::kDeltaS) {
    const long long q_blocks = size.padded_q / Config::kVariantBlockQ;
    tile.delta_s = reinterpret_cast<const float *>(params.workspace + params.offsets.delta_s) +
                   (tile.q_head_index * q_blocks + tile.q_begin / Config::kVariantBlockQ) * size.padded_kv;
  }
  if constexpr (Config::kCausal) { // blocks after the diagonal of this Q block's last row are skipped
    const int last_row = min(tile.q_begin + Config::kBlockQ, size.tokens_q) - 1;
    const int last_visible_token = last_row + params.causal_offset;
    tile.block_end = last_visible_token < 0 ? 0 : min(kv_blocks, last_visible_token / Config::kBlockKv + 1);
  }
  return tile;
}

// Q_i's codes and scales into shared memory (one cp.async group).
template <class Config>
__device__ __forceinline__ void load_q(unsigned char *shared, const SageAttentionParams &params, const Tile &tile) {
  using Layout = SharedLayout<Config>;
  const SageProblemSize &size = params.size;
  const unsigned char *codes = params.workspace + params.offsets.q_codes +
                               (tile.q_head_index * size.padded_q + tile.q_begin) * Layout::kCodeRowBytes;
  constexpr int kPiecesPerRow = Layout::kCodeRowBytes / 16;
  for (int piece = threadIdx.x; piece < Config::kBlockQ * kPiecesPerRow; piece += Config::kThreads) {
    const int row = piece / kPiecesPerRow, column = piece % kPiecesPerRow * 16;
    cp_async<16>(shared + Layout::kQCodes + row * Layout::kCodePitch + column,
                 codes + row * Layout::kCodeRowBytes + column);
  }
  const unsigned char *scales = params.workspace + params.offsets.q_scales +
                                (tile.q_head_index * size.padded_q + tile.q_begin) * Layout::kScaleRowBytes;
  for (int piece = threadIdx.x; piece < Config::kBlockQ * Layout::kScaleRowBytes / 16; piece += Config::kThreads)
    cp_async<16>(shared + Layout::kQScales + piece * 16, scales + piece * 16);
}

// K_j's and V_j^T's codes and scales (and delta_s's block) into `stage`: the caller commits the group.
template <class Config>
__device__ __forceinline__ void load_kv(unsigned char *stage, const SageAttentionParams &params, const Tile &tile,
                                        int block) {
  using Layout = SharedLayout<Config>;
  const SageProblemSize &size = params.size;
  const long long kv_begin = static_cast<long long>(block) * Config::kBlockKv;
  const unsigned char *workspace = params.workspace;
  const unsigned char *k_codes =
      workspace + params.offsets.k_codes + (tile.kv_head_index * size.padded_kv + kv_begin) * Layout::kCodeRowBytes;
  constexpr int kPiecesPerRow = Layout::kCodeRowBytes / 16;
  for (int piece = threadIdx.x; piece < Config::kBlockKv * kPiecesPerRow; piece += Config::kThreads) {
    const int row = piece / kPiecesPerRow, column = piece % kPiecesPerRow * 16;
    cp_async<16>(stage + Layout::kKCodes + row * Layout::kCodePitch + column,
                 k_codes + row * Layout::kCodeRowBytes + column);
  }
  const unsigned char *k_scales =
      workspace + params.offsets.k_scales + (tile.kv_head_index * size.padded_kv + kv_begin) * Layout::kScaleRowBytes;
  for (int piece = threadIdx.x; piece < Config::kBlockKv * Layout::kScaleRowBytes / 16; piece += Config::kThreads)
    cp_async<16>(stage + Layout::kKScales + piece * 16, k_scales + piece * 16);
  // V^T: one row per channel, padded_kv / 2 bytes of codes and padded_kv / G scale bytes long.
  const long long value_row = size.padded_kv / 2, value_scale_row = size.padded_kv / Config::kScaleGroup;
  const unsigned char *v_codes =
      workspace + params.offsets.v_codes + tile.kv_head_index * Config::kHeadDim * value_row + kv_begin / 2;
  constexpr int kValuePieces = Layout::kValueRowBytes / 16;
  for (int piece = threadIdx.x; piece < Config::kHeadDim * kValuePieces; piece += Config::kThreads) {
    const int channel = piece / kValuePieces, column = piece % kValuePieces * 16;
    cp_async<16>(stage + Layout::kVCodes + channel * Layout::kValuePitch + column,
                 v_codes + channel * value_row + column);
  }
  const unsigned char *v_scales = workspace + params.offsets.v_scales +
                                  tile.kv_head_index * Config::kHeadDim * value_scale_row +
                                  kv_begin / Config::kScaleGroup;
  constexpr int kScaleBytes = Layout::kValueScaleRowBytes;
  for (int channel = threadIdx.x; channel < Config::kHeadDim; channel += Config::kThreads) {
    unsigned char *target = stage + Layout::kVScales + channel * kScaleBytes;
    if constexpr (kScaleBytes >= 4) {
      cp_async<kScaleBytes>(target, v_scales + channel * value_scale_row);
    } else { // MXFP4 with 64-token blocks: two bytes per channel, below cp.async's smallest copy
      *reinterpret_cast<unsigned short *>(target) =
          *reinterpret_cast<const unsigned short *>(v_scales + channel * value_scale_row);
    }
  }
  if constexpr (Config::kDeltaS) { // delta_s rows are padded_kv long (padding 0): whole 16-byte pieces
    unsigned char *target = stage + Layout::kDeltaS;
    const unsigned char *source = reinterpret_cast<const unsigned char *>(tile.delta_s + kv_begin);
    for (int piece = threadIdx.x; piece < Config::kBlockKv * 4 / 16; piece += Config::kThreads)
      cp_async<16>(target + piece * 16, source + piece * 16);
  }
}

// The two-level P's first-level scale and its inverse, as numerics::symmetricScale(amax, 448 x 6): f32 divisions
// rounded to nearest (not the fast approximate ones), 0 and 0 for an all-zero row.
__device__ __forceinline__ void first_level_scale(float amax, float &scale, float &inverse) {
  const bool zero = !(amax > 0.0f);
  scale = zero ? 0.0f : __fdiv_rn(amax, kTwoLevelRange);
  inverse = zero ? 0.0f : __fdiv_rn(kTwoLevelRange, amax);
}

// The microscale code of a group from its amax and the inverse that quantizes it, as numerics::nvfp4ScaleBits /
// mxfp4ScaleBits and quantizeOperand: NVFP4 code = ue4m3(amax / 6), inverse = 1 / ue4m3 value (0 for 0); MXFP4
// code = floor(log2 amax) - 2 + 127 clamped to [0, 254] (0 for an all-zero group), inverse = 2^(127 - code).
template <class Config> __device__ __forceinline__ unsigned microscale(float amax, float &inverse) {
  if constexpr (Config::kScaleGroup == 16) {
    const unsigned code = ue4m3_code(__fdiv_rn(amax, 6.0f));
    const float scale = ue4m3_value(code);
    inverse = scale > 0.0f ? __frcp_rn(scale) : 0.0f;
    return code;
  } else {
    // P~ <= 2688 and ex2.approx.ftz makes no subnormals: amax is 0 or normal, its biased exponent is floor(log2).
    const int exponent = static_cast<int>((__float_as_uint(amax) >> 23) & 0xffu);
    const int code = amax > 0.0f ? min(max(exponent - 2, 0), 254) : 0;
    const int inverse_exponent = 127 - code; // 2^(127 - code): normal for code <= 253
    inverse = code <= 253 ? __uint_as_float(static_cast<unsigned>(inverse_exponent + 127) << 23) : 0x1p-127f;
    return static_cast<unsigned>(code);
  }
}

// P~ of one 64-column chunk of S (n8 tiles 8c .. 8c + 7 of `p`, already divided by s_P1 when two-level) as the P.V
// mma's A operand and its scale register. The accumulators are the A operand in place (fragments.cuh); only the
// microscales need the quad: a 16-token group spans two lanes (NVFP4), a 32-token group four (MXFP4).
template <class Config>
__device__ __forceinline__ void quantize_probabilities(const float (&p)[Config::kBlockKv / 8][4], int chunk,
                                                       unsigned (&a)[4], unsigned &scale_a, int lane) {
  unsigned codes[2][2]; // [row half][tiles 0-3 | tiles 4-7 of the chunk]
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      float amax = 0.0f;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int tile = chunk * 8 + part * 4 + t;
        amax = fmaxf(amax, fmaxf(p[tile][2 * half], p[tile][2 * half + 1]));
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      if constexpr (Config::kScaleGroup == 32)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      float inverse;
      codes[half][part] = microscale<Config>(amax, inverse);
      unsigned packed = 0;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const int tile = chunk * 8 + part * 4 + t;
        packed |= pack_e2m1x2(p[tile][2 * half] * inverse, p[tile][2 * half + 1] * inverse) << (8 * t);
      }
      a[p_register(part * 4, 2 * half)] = packed;
    }
  // Scale A: this lane provides row scale_a_row(lane) = g + 8 (lane % 2).
  const int half = lane % 2;
  if constexpr (Config::kScaleGroup == 16) {
    const unsigned low = codes[half][0], high = codes[half][1]; // groups 0/1 and 2/3 come from different lanes
    scale_a = __shfl_sync(0xffffffffu, low, p_scale_source_lane(lane, 0)) |
              __shfl_sync(0xffffffffu, low, p_scale_source_lane(lane, 1)) << 8 |
              __shfl_sync(0xffffffffu, high, p_scale_source_lane(lane, 2)) << 16 |
              __shfl_sync(0xffffffffu, high, p_scale_source_lane(lane, 3)) << 24;
  } else {
    scale_a = codes[half][0] | codes[half][1] << 8;
  }
}

template <class Config> __device__ __forceinline__ void attention_kernel(const SageAttentionParams &params) {
  using Layout = SharedLayout<Config>;
  constexpr int kTiles = Config::kBlockKv / 8;          // n8 tiles of S
  constexpr int kChunks = Config::kBlockKv / kMmaK;     // k64 steps of P.V
  constexpr int kDepthSteps = Config::kHeadDim / kMmaK; // k64 steps of Q.K^T
  constexpr int kOutputTiles = Config::kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char shared[];
  const SageProblemSize &size = params.size;
  const Tile tile = tile_of<Config>(params);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = lane / 4, quad_lane = lane % 4;
  const int warp_row = warp * 16; // this warp's 16 rows of the CTA's block
  int rows[2];
  rows[0] = tile.q_begin + warp_row + group;
  rows[1] = rows[0] + 8;

  // ---- Prologue of the pipeline: Q_i, then the first kStages - 1 K/V blocks ----
  load_q<Config>(shared, params, tile);
  cp_async_commit();
#pragma unroll
  for (int block = 0; block < Config::kStages - 1; ++block) {
    if (block < tile.block_end)
      load_kv<Config>(shared + Layout::kStageOffset + block * Layout::kStageBytes, params, tile, block);
    cp_async_commit();
  }
  cp_async_wait<Config::kStages - 1>();
  __syncthreads();

  // Q_i's A fragments and scales stay in registers for the whole loop.
  unsigned q_codes[kDepthSteps][4], q_scales[kDepthSteps];
#pragma unroll
  for (int step = 0; step < kDepthSteps; ++step) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg)
      q_codes[step][reg] = *reinterpret_cast<const unsigned *>(shared + Layout::kQCodes +
                                                               (warp_row + a_row(lane, reg)) * Layout::kCodePitch +
                                                               step * (kMmaK / 2) + a_k(lane, reg, 0) / 2);
    q_scales[step] =
        load_scales<Config>(shared + Layout::kQScales + (warp_row + scale_a_row(lane)) * Layout::kScaleRowBytes +
                            step * (kMmaK / Config::kScaleGroup));
  }

  float domain = Config::kDomainFactor;
  if constexpr (Config::kDomainFactorFromParams)
    domain = params.softmax_scale * Config::kLog2e;

  float output[kOutputTiles][4];
  clear_tiles(output);
  float row_max[2] = {negative_infinity(), negative_infinity()};
  float row_sum[2] = {0.0f, 0.0f}; // this lane's part; the quad's lanes are summed in the epilogue

  for (int block = 0; block < tile.block_end; ++block) {
    cp_async_wait<Config::kStages - 2>();
    __syncthreads(); // K_j/V_j landed for every thread; the stage loaded below is no longer read
    {
      const int next = block + Config::kStages - 1;
      if (next < tile.block_end)
        load_kv<Config>(shared + Layout::kStageOffset + (next % Config::kStages) * Layout::kStageBytes, params, tile,
                        next);
      cp_async_commit();
    }
    const unsigned char *stage = shared + Layout::kStageOffset + (block % Config::kStages) * Layout::kStageBytes;
    const int kv_begin = block * Config::kBlockKv;

    // ---- S_i^j = Q^_i K^_j^T (block-scaled FP4 mma), K's rows read in score_column_token order ----
    float scores[kTiles][4];
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        scores[t][e] = 0.0f;
      const int key = score_column_token(t * 8 + b_column(lane));
#pragma unroll
      for (int step = 0; step < kDepthSteps; ++step) {
        const unsigned char *codes = stage + Layout::kKCodes + key * Layout::kCodePitch + step * (kMmaK / 2);
        const unsigned b0 = *reinterpret_cast<const unsigned *>(codes + b_k(lane, 0, 0) / 2);
        const unsigned b1 = *reinterpret_cast<const unsigned *>(codes + b_k(lane, 1, 0) / 2);
        const unsigned scale_b = load_scales<Config>(stage + Layout::kKScales + key * Layout::kScaleRowBytes +
                                                     step * (kMmaK / Config::kScaleGroup));
        block_scaled_mma<Config>(scores[t], q_codes[step], b0, b1, q_scales[step], scale_b);
      }
    }

    // ---- + delta_s, into the exponent's domain, mask; m_i^j = max(m_i^{j-1}, rowmax(S_i^j)) ----
    float tile_max[2] = {negative_infinity(), negative_infinity()};
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2;
        const int token = kv_begin + score_column_token(t * 8 + accumulator_column(lane, e));
        float s = scores[t][e];
        if constexpr (Config::kDeltaS)
          s += reinterpret_cast<const float *>(stage + Layout::kDeltaS)[token - kv_begin];
        s *= domain;
        bool visible = token < size.tokens_kv;
        if constexpr (Config::kCausal)
          visible = visible && token <= rows[half] + params.causal_offset;
        s = visible ? s : negative_infinity();
        scores[t][e] = s;
        tile_max[half] = fmaxf(tile_max[half], s);
      }
    float alpha[2], first_scale[2] = {1.0f, 1.0f}, first_inverse[2] = {1.0f, 1.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      tile_max[half] = quad_max(tile_max[half]);
      const float new_max = fmaxf(row_max[half], tile_max[half]);
      const float reference = new_max == negative_infinity() ? 0.0f : new_max; // a row masked so far stays 0
      alpha[half] = fast_exp2(row_max[half] - reference);
      row_max[half] = new_max;
      tile_max[half] -= reference;
      // ---- P~ = exp2(S - m); l_i^j = alpha l + rowsum(P~) (before P is quantized, as the reference sums) ----
      float sum = 0.0f;
#pragma unroll
      for (int t = 0; t < kTiles; ++t)
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          scores[t][e] = fast_exp2(scores[t][e] - reference);
          sum += scores[t][e];
        }
      row_sum[half] = alpha[half] * row_sum[half] + sum;
      if constexpr (Config::kTwoLevelP) {
        // rowmax(P~) is exp2 of the row max already taken for m (the same f32 argument, so the same bits as the
        // largest P~): no second reduction. s_P1 = rowmax(P~) / (448 x 6); P~ / s_P1 fills UE4M3 x E2M1's range.
        first_level_scale(fast_exp2(tile_max[half]), first_scale[half], first_inverse[half]);
#pragma unroll
        for (int t = 0; t < kTiles; ++t)
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e)
            scores[t][e] *= first_inverse[half];
      }
    }
#pragma unroll
    for (int t = 0; t < kOutputTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        output[t][e] *= alpha[e / 2];

    // ---- P^ = psi_P(P~): e2m1 codes and microscales in registers ----
    unsigned p_codes[kChunks][4], p_scales[kChunks];
#pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk)
      quantize_probabilities<Config>(scores, chunk, p_codes[chunk], p_scales[chunk], lane);

      // ---- O_i^j = diag(alpha) O_i^{j-1} + s_P1 (P^ V^_j) (block-scaled FP4 mma on V^T codes) ----
#pragma unroll
    for (int t = 0; t < kOutputTiles; ++t) {
      const int channel = t * 8 + b_column(lane);
      float product[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int chunk = 0; chunk < kChunks; ++chunk) {
        const unsigned char *codes = stage + Layout::kVCodes + channel * Layout::kValuePitch + chunk * (kMmaK / 2);
        const unsigned b0 = *reinterpret_cast<const unsigned *>(codes + b_k(lane, 0, 0) / 2);
        const unsigned b1 = *reinterpret_cast<const unsigned *>(codes + b_k(lane, 1, 0) / 2);
        const unsigned scale_b = load_scales<Config>(stage + Layout::kVScales + channel * Layout::kValueScaleRowBytes +
                                                     chunk * (kMmaK / Config::kScaleGroup));
        if constexpr (Config::kTwoLevelP)
          block_scaled_mma<Config>(product, p_codes[chunk], b0, b1, p_scales[chunk], scale_b);
        else
          block_scaled_mma<Config>(output[t], p_codes[chunk], b0, b1, p_scales[chunk], scale_b);
      }
      if constexpr (Config::kTwoLevelP)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          output[t][e] += first_scale[e / 2] * product[e];
    }
  }
  cp_async_wait<0>(); // no copy may outlive the CTA's shared memory

  // ---- Epilogue: O_i = diag(l)^-1 O_i, LSE = m + log2(l) (in ln units, + q . mean(K) / sqrt(d)) ----
  unsigned short *o =
      static_cast<unsigned short *>(params.o) + tile.batch * params.o_strides.batch + tile.head * params.o_strides.head;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    row_sum[half] = quad_sum(row_sum[half]);
    const int row = rows[half];
    if (row >= size.tokens_q)
      continue;
    const float inverse_sum = row_sum[half] > 0.0f ? 1.0f / row_sum[half] : 0.0f;
#pragma unroll
    for (int t = 0; t < kOutputTiles; ++t) {
      const int channel = t * 8 + quad_lane * 2;
      const float low = output[t][2 * half] * inverse_sum, high = output[t][2 * half + 1] * inverse_sum;
      const unsigned packed = Config::kBf16 ? pack_bf16x2(low, high) : pack_f16x2(low, high);
      *reinterpret_cast<unsigned *>(o + row * params.o_strides.token + channel) = packed;
    }
  }
  if constexpr (Config::kWriteLse) {
    if (params.lse)
      sm90::write_lse<Config>(params, tile, rows, row_max, row_sum, quad_lane, 0.0f);
  }
}

} // namespace sage::device::sm120
