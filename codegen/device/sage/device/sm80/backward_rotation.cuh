// SageBwd's randomized Hadamard rotation (issue 25; Config::kRotate), shared by the mma.sync and the wgmma backward.
// The preprocess quantizes Q R_Q and K R_K (after K smoothing) instead of Q and K, bit for bit as the forward's
// prologue and sage/numerics/Hadamard.h rotate: the scores S = (Q R_Q)(K R_K)^T are unchanged (R_Q R_K^T = I), so the
// forward's LSE still holds and the main kernels run unchanged. Their dQ = dS (K R_K) and dK = dS^T (Q R_Q) are then
// in the rotated basis: write_dq multiplies dQ by R_K^-1 = D H 2^-e_Q on its way to the output, and the main kernels'
// epilogues dK by R_Q^-1 = D H 2^-e_K (write_unrotated_key_rows). dV does not involve Q or K.
//
// The Config gives the rotation: kRotationSigns0..3 (bit c of word c / 64 negates channel c) and kRotationScaleQ,
// kRotationScaleK (2^-e_Q, 2^-e_K), generated from sage/numerics/Hadamard.h.
#pragma once

#include "sage/device/hadamard.cuh"
#include "sage/device/sm90/common.cuh"

namespace sage::device::sm80::backward {

// The sign bits of channels channel .. channel + 7 (channel a multiple of 8: never straddles a 64-bit word).
template <class Config> __device__ __forceinline__ unsigned rotation_sign_bits(int channel) {
  const unsigned long long word = channel < 64    ? Config::kRotationSigns0
                                  : channel < 128 ? Config::kRotationSigns1
                                  : channel < 192 ? Config::kRotationSigns2
                                                  : Config::kRotationSigns3;
  return static_cast<unsigned>(word >> (channel % 64)) & 0xffu;
}

// Rows of head_dim channels, 8 to a lane, on head_dim / 8 consecutive lanes of one warp: the lane holding channels
// `channel` .. + 7 is lane channel / 8 of its row (every caller's layout). All lanes of the warp call these.
template <class Config> constexpr int kRotationLanes = Config::kHeadDim / 8;

// x R_Q (kForK false) or x R_K of this lane's 8 channels: x H, then the signs and 2^-e.
template <class Config, bool kForK> __device__ __forceinline__ void rotate_piece(float (&x)[8], int channel) {
  walsh_hadamard_row<8, kRotationLanes<Config>>(x, channel / 8);
  apply_signs(x, rotation_sign_bits<Config>(channel), kForK ? Config::kRotationScaleK : Config::kRotationScaleQ);
}

// y R_K^-1 (kOfK: dQ, computed from K R_K) or y R_Q^-1 (dK): R_K^-1 = R_Q^T = D H 2^-e_Q and R_Q^-1 = D H 2^-e_K, i.e.
// the signs and the other operand's 2^-e first (exact), then y H.
template <class Config, bool kOfK> __device__ __forceinline__ void unrotate_piece(float (&x)[8], int channel) {
  apply_signs(x, rotation_sign_bits<Config>(channel), kOfK ? Config::kRotationScaleQ : Config::kRotationScaleK);
  walsh_hadamard_row<8, kRotationLanes<Config>>(x, channel / 8);
}

// Eight values as four words of the input type, the first at the lowest address.
template <bool kBf16> __device__ __forceinline__ uint4 pack_eight(const float (&x)[8]) {
  unsigned words[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    words[j] = kBf16 ? sm90::pack_bf16x2(x[2 * j], x[2 * j + 1]) : sm90::pack_f16x2(x[2 * j], x[2 * j + 1]);
  return make_uint4(words[0], words[1], words[2], words[3]);
}

// Bytes of shared memory write_unrotated_key_rows stages through, for `warps` warps (rows padded by 8 floats: the
// accumulator layout's pair stores then spread over the banks).
template <int kHeadDim> constexpr int kUnrotateRowFloats = kHeadDim + 8;
template <int kHeadDim, int kWarps>
constexpr int kUnrotateStagingBytes = kWarps * 16 * kUnrotateRowFloats<kHeadDim> * 4;

// One warp's 16 key rows of dK in the input type, rotated back by R_Q^-1. The warp holds them as an mma accumulator
// does: pair(j, half) is the float2 of rows g + 8 half and channels 8j + 2t, 8j + 2t + 1 (g = lane / 4, t = lane % 4),
// already multiplied by 1/sqrt(d). `staging` is this warp's kUnrotateStagingBytes<kHeadDim, 1> of shared memory, which
// nothing else uses (the caller synchronizes the CTA before the first call). Keys at or beyond tokens_kv are not
// written.
template <class Config, class Pair>
__device__ __forceinline__ void write_unrotated_key_rows(float *staging, const Pair &pair, unsigned *d_k_head,
                                                         int first_key, int tokens_kv) {
  constexpr int kHeadDim = Config::kHeadDim, kRow = kUnrotateRowFloats<kHeadDim>;
  constexpr int kLanes = kRotationLanes<Config>, kRowsPerPass = 32 / kLanes;
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kHeadDim / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      *reinterpret_cast<float2 *>(staging + (g + 8 * half) * kRow + 8 * j + 2 * t) = pair(j, half);
  __syncwarp();
  const int channel = lane % kLanes * 8;
#pragma unroll
  for (int pass = 0; pass < 16 / kRowsPerPass; ++pass) {
    const int row = pass * kRowsPerPass + lane / kLanes, key = first_key + row;
    const float4 low = *reinterpret_cast<const float4 *>(staging + row * kRow + channel);
    const float4 high = *reinterpret_cast<const float4 *>(staging + row * kRow + channel + 4);
    float x[8] = {low.x, low.y, low.z, low.w, high.x, high.y, high.z, high.w};
    unrotate_piece<Config, false>(x, channel);
    if (key < tokens_kv) { // 4-byte stores, as the unrotated epilogue's (the caller's tensors are 4-byte aligned)
      const uint4 words = pack_eight<Config::kBf16>(x);
      unsigned *out = d_k_head + (static_cast<long long>(key) * kHeadDim + channel) / 2;
      out[0] = words.x, out[1] = words.y, out[2] = words.z, out[3] = words.w;
    }
  }
}

} // namespace sage::device::sm80::backward
