// The quantization prologue's FP4 psi_V on one V tile (launch 1), microscaled along the tokens (P.V's reduction axis)
// and transposed: e2m1 codes of V^T into v_codes [b, h_kv, d, padded_kv / 2] (token 2t in the low nibble of byte t)
// and one scale per kGroupTokens tokens of a channel into v_scales [b, h_kv, d, padded_kv / kGroupTokens] (MXFP4:
// 32 tokens, ue8m0; NVFP4: 16 tokens, ue4m3); padded tokens are 0. The prologue generator pastes this header after
// its constants, the input header, fp4/microscaling.cuh and v_tile.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

template <int kGroupTokens>
__device__ __forceinline__ void quantizeFp4VTileOf(const SagePrologueParams &params, long long cta, unsigned char *) {
  static_assert(kGroupTokens == 32 || kGroupTokens == 16, "MXFP4 or NVFP4");
  const VTileTask v_tile = vTileTask(params, cta);
  const auto scale_code = [](float amax) {
    if constexpr (kGroupTokens == 32)
      return sage::device::fp4::mxfp4_scale_code(amax);
    else
      return sage::device::fp4::nvfp4_scale_code(amax);
  };
  const auto inverse_of = [](unsigned scale) {
    if constexpr (kGroupTokens == 32)
      return sage::device::fp4::mxfp4_inverse(scale);
    else
      return sage::device::fp4::nvfp4_inverse(scale);
  };
  const int stored_tokens = min(kVTileTokens, params.size.padded_kv - v_tile.first);
  unsigned char *codes = params.workspace + params.offsets.v_codes;
  unsigned char *scales = params.workspace + params.offsets.v_scales;
  // A task is one channel x one group of tokens; neighbouring threads take neighbouring channels, so that each
  // token's loads are contiguous.
  for (int task = threadIdx.x; task < kHeadDim * (kVTileTokens / kGroupTokens); task += kThreads) {
    const int channel = task % kHeadDim, token = task / kHeadDim * kGroupTokens;
    if (token >= stored_tokens)
      break; // tasks only move on to later groups
    float x[kGroupTokens];
    float amax = 0.0f;
#pragma unroll
    for (int t = 0; t < kGroupTokens; ++t) {
      x[t] = token + t < v_tile.valid_rows ? inputToFloat(v_tile.v[(token + t) * v_tile.token_stride + channel]) : 0.0f;
      amax = sage::device::fp4::max_magnitude(amax, x[t]);
    }
    const unsigned scale = scale_code(amax);
    const float inverse = inverse_of(scale);
    const long long row = v_tile.head * kHeadDim + channel; // V^T's row
    unsigned *out = (unsigned *)(codes + row * (params.size.padded_kv / 2) + (v_tile.first + token) / 2);
#pragma unroll
    for (int word = 0; word < kGroupTokens / 8; ++word) {
      float eight[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        eight[j] = x[8 * word + j];
      out[word] = sage::device::fp4::pack_e2m1x8(eight, inverse);
    }
    scales[row * (params.size.padded_kv / kGroupTokens) + (v_tile.first + token) / kGroupTokens] = (unsigned char)scale;
  }
}

} // namespace sage::device::prologue
