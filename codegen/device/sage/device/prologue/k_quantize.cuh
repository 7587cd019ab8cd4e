// The quantization prologue's psi_K role on kKBlocksPerTile KV blocks of one KV head: k_codes [b, h_kv, padded_kv, d]
// (padded rows 0) and the blocks' k_scales, or the per-tensor scale, FP4 codes and microscales, or K (gamma(K)) rounded
// to the input type when K is not quantized. Role is the variant's KRole (generated: a Config of flags, its K tile and
// its KQuantizer). The prologue generator pastes this header after its constants, sequences.cuh, the tile library,
// k_tile.cuh and the headers of the steps the variant has (k_statistics.cuh, q_mean_correction.cuh, rotation.cuh,
// microscaled_tile.cuh), whose names it uses; the steps a variant lacks are only declared below, and never
// instantiated.
#pragma once

namespace sage::device::prologue {

template <bool kSmoothed, bool kMinMax>
__device__ __forceinline__ float combineKStatistics(const SagePrologueParams &params, long long head, int tokens,
                                                    bool store, float *channel_mean, unsigned *amax_slot);
template <class KValues>
__device__ __forceinline__ void writeQMeanCorrection(const KValues &k, const SagePrologueParams &params, long long head,
                                                     int first, int stored_rows);
template <int kTileTokens> struct RotatedTile;
template <int kTileTokens, bool kForK, class Values>
__device__ __forceinline__ RotatedTile<kTileTokens> rotateTile(const Values &values);
template <class Quantizer, class Values>
__device__ __forceinline__ void storeMicroscaledTile(const Values &values, unsigned char *codes, unsigned char *scales,
                                                     int stored_rows);

// The codes of x (K, gamma(K) or its rotation) from row `first` of KV head `head`: with the per-tensor scale of
// `amax` (tile 0 stores it), or with one scale per group of rows (the blocks' k_scales).
template <class Quantizer, bool kPerTensor, class Values>
__device__ __forceinline__ void storeKTileCodes(const Values &x, const SagePrologueParams &params, long long head,
                                                int first, int stored_rows, [[maybe_unused]] float amax,
                                                unsigned char *codes, [[maybe_unused]] unsigned char *shared) {
  if constexpr (kPerTensor) {
    const SymmetricScale scale = symmetricScale(amax, Quantizer::kCodeMax);
    if (first == 0 && threadIdx.x == 0)
      workspaceFloats(params, params.offsets.k_scales)[head] = scale.scale;
    storeTileCodes<Quantizer>(x, codes, stored_rows, [&](int) { return scale.inverse; });
  } else {
    float *scales = workspaceFloats(params, params.offsets.k_scales) + head * params.size.k_scale_count +
                    (long long)(first / kBlockKv) * Quantizer::kGroupsPerBlock;
    quantizeTile<Quantizer>(x, codes, scales, stored_rows, stored_rows / kBlockKv * Quantizer::kGroupsPerBlock, shared);
  }
}

// psi_K (or the cast) of tile `cta` of the role: Role::kStatistics (mean(K) and/or the per-tensor amax of the whole
// sequence, k_statistics.cuh), kSmoothed (gamma(K)), kQMeanCorrection (Q smoothing's delta_s from this tile),
// kRotated (x R_K, after smoothing: the correction above took the unrotated x), kCast, kMicroscaled, kPerTensor.
template <class Role>
__device__ __forceinline__ void quantizeKTileOf(const SagePrologueParams &params, long long cta,
                                                unsigned char *shared) {
  using Quantizer = typename Role::Quantizer;
  const int tiles = (int)ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile);
  const long long head = cta / tiles; // batch index * heads_kv + KV head index
  const int first = (int)(cta % tiles) * kKTileTokens;
  const SequenceRows rows = keyRows(params, head);
  const int valid_rows = min(kKTileTokens, rows.length - first);            // <= 0 past a packed sequence: zero codes
  const int stored_rows = min(kKTileTokens, params.size.padded_kv - first); // whole KV blocks
  typename Role::Tile k;
  k.tile.load(rows.rows + first * rows.token_stride, rows.token_stride, valid_rows);
  [[maybe_unused]] float amax = 0.0f;
  if constexpr (Role::kStatistics) {
    // The statistics of the whole sequence, while this tile's loads are in flight.
    float *channel_mean = (float *)(shared + kTileMeansOffset);
    amax = combineKStatistics<Role::kSmoothed, Role::kPerTensor>(params, head, rows.length, first == 0, channel_mean,
                                                                 (unsigned *)(shared + kTileGroupAmaxOffset));
    if constexpr (Role::kSmoothed) {
      k.valid_rows = valid_rows;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        k.mean[j] = channel_mean[TokenTile<kKTileTokens>::channel() + j];
    }
  }
  if constexpr (Role::kQMeanCorrection)
    writeQMeanCorrection(k, params, head, first, stored_rows);
  if constexpr (Role::kCast) {
    (void)shared;
    unsigned short *values = (unsigned short *)(params.workspace + params.offsets.k_codes) +
                             (head * params.size.padded_kv + first) * kHeadDim;
    storeTileValues<Quantizer>(k, values, stored_rows);
  } else if constexpr (Role::kMicroscaled) {
    // FP4: e2m1 codes [b, h_kv, padded_kv, d / 2], microscales [b, h_kv, padded_kv, d / group]
    unsigned char *codes =
        params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * (kHeadDim / 2);
    unsigned char *scales = params.workspace + params.offsets.k_scales +
                            (head * params.size.padded_kv + first) * (kHeadDim / Quantizer::kGroupChannels);
    storeMicroscaledTile<Quantizer>(k, codes, scales, stored_rows);
  } else {
    unsigned char *codes =
        params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * kHeadDim;
    if constexpr (Role::kRotated)
      storeKTileCodes<Quantizer, Role::kPerTensor>(rotateTile<kKTileTokens, true>(k), params, head, first, stored_rows,
                                                   amax, codes, shared); // x R_K, issue 28
    else
      storeKTileCodes<Quantizer, Role::kPerTensor>(k, params, head, first, stored_rows, amax, codes, shared);
  }
}

} // namespace sage::device::prologue
