// The quantization prologue's per-channel psi_V on one V tile (launch 2): codes of V, or of V - mean(V) when
// kSmoothed, transposed to v_codes [b, h_kv, d, padded_kv] for the mma B operand (padded tokens get code 0); tile 0
// also stores v_scales (and v_mean). VQuantizer is the generated psi_V (kCodeMax, code); TokenOrder::token(p) is the
// token at position p of v_codes' token axis (NaturalTokenOrder, or WgmmaTokenOrder of v_token_order.cuh). The
// prologue generator pastes this header after its constants, global_memory.cuh, v_codes.cuh, v_tile.cuh and
// v_statistics.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// v_codes' positions are the tokens.
struct NaturalTokenOrder {
  static __device__ __forceinline__ int token(int position) { return position; }
};

template <bool kSmoothed, class VQuantizer, class TokenOrder>
__device__ __forceinline__ void quantizeVTileOf(const SagePrologueParams &params, long long cta,
                                                unsigned char *shared) {
  const VTileTask v_tile = vTileTask(params, cta);
  float *channel_mean = (float *)shared;
  float *channel_inverse = channel_mean + kHeadDim;
  unsigned *transposed = (unsigned *)(shared + 2 * kHeadDim * 4); // [kHeadDim][kVTileWords], swizzled

  // A task is 4 consecutive positions (tokens, in the natural order) x 8 channels: the 4 codes of one channel pack
  // into one word. The loads are issued first, so that they are in flight while the statistics are combined.
  constexpr int kTasks = kVTileWords * kVectorsPerRow;
  constexpr int kTasksPerThread = (kTasks + kThreads - 1) / kThreads;
  uint4 raw[kTasksPerThread][4];
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int row = TokenOrder::token(4 * word + t);
      raw[i][t] = task < kTasks && row < v_tile.valid_rows ? loadVector(v_tile.v + row * v_tile.token_stride + channel)
                                                           : uint4{0u, 0u, 0u, 0u};
    }
  }
  combineVStatistics<kSmoothed, true, VQuantizer>(params, v_tile.head, v_tile.length, v_tile.tile == 0, channel_mean,
                                                  channel_inverse);
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    if (task >= kTasks)
      break;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j) {
      const float inverse = channel_inverse[channel + j];
      float scaled[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        float x;
        if constexpr (kSmoothed)
          x = TokenOrder::token(4 * word + t) < v_tile.valid_rows
                  ? __fsub_rn(elementOf(raw[i][t], j), channel_mean[channel + j])
                  : 0.0f;
        else
          x = elementOf(raw[i][t], j);
        scaled[t] = __fmul_rn(x, inverse);
      }
      transposed[(channel + j) * kVTileWords + (word ^ vTileSwizzle(channel + j))] =
          VQuantizer::codes4(scaled[0], scaled[1], scaled[2], scaled[3]);
    }
  }
  __syncthreads();

  // 16 bytes (16 tokens of one channel) a thread: the consecutive threads of a channel row write its 128-byte lines.
  // Word w of a row lies at w ^ swizzle: the 4 words of one 16-byte group stay in one group, permuted by the
  // swizzle's two low bits.
  constexpr int kVectorsPerVRow = kVTileWords / 4;
  const int stored_vectors = min(kVTileTokens, params.size.padded_kv - v_tile.first) / 16; // whole KV blocks
  unsigned char *row0 =
      params.workspace + params.offsets.v_codes + v_tile.head * kHeadDim * params.size.padded_kv + v_tile.first;
#pragma unroll
  for (int index = (int)threadIdx.x; index < kHeadDim * kVectorsPerVRow; index += kThreads) {
    const int c = index / kVectorsPerVRow, vector = index % kVectorsPerVRow;
    if (vector >= stored_vectors)
      continue;
    const int swizzle = vTileSwizzle(c);
    uint4 words = *(const uint4 *)&transposed[c * kVTileWords + 4 * (vector ^ (swizzle >> 2))];
    if (swizzle & 2) {
      const unsigned x = words.x, y = words.y;
      words.x = words.z;
      words.y = words.w;
      words.z = x;
      words.w = y;
    }
    if (swizzle & 1) {
      const unsigned x = words.x, z = words.z;
      words.x = words.y;
      words.y = x;
      words.z = words.w;
      words.w = z;
    }
    *(uint4 *)(row0 + (long long)c * params.size.padded_kv + 16 * vector) = words;
  }
}

} // namespace sage::device::prologue
