// The Q block of the quantization prologue's psi_Q roles: kBlockQ tokens of Q in registers, and the x that psi_Q
// quantizes. The prologue generator pastes this header after its constants, sequences.cuh, token_tile.cuh and
// tile_reductions.cuh (tileColumnMeans), whose names it uses, and names the variant's block:
// `using QBlock = QBlockOf<prescaled, smoothed>`.
#pragma once

namespace sage::device::prologue {

// x = Q, times q_prescale when kPrescaled (the softmax scale 1/sqrt(d) * log2(e) folded into psi_Q, paper 4.6, one
// f32 multiply), minus the block's per-channel mean of that when kSmoothed (Q smoothing, SageAttention2, one f32
// subtraction). Rows past the sequence are 0. A member the variant does not use is never written or read.
template <bool kPrescaled, bool kSmoothed> struct QBlockOf {
  TokenTile<kBlockQ> tile;
  int valid_rows;              // tokens of this block inside the sequence
  float prescale;              // params.q_prescale (kPrescaled)
  float mean[kVectorElements]; // the block mean of this thread's channels (kSmoothed)

  __device__ __forceinline__ float scaled(int pass, int j) const {
    if constexpr (kPrescaled)
      return __fmul_rn(tile.element(pass, j), prescale);
    else
      return tile.element(pass, j);
  }
  __device__ __forceinline__ float operator()(int pass, int j) const {
    if constexpr (kSmoothed)
      return TokenTile<kBlockQ>::row(pass) < valid_rows ? __fsub_rn(scaled(pass, j), mean[j]) : 0.0f;
    else
      return scaled(pass, j);
  }
  // max_j |x(pass, j)| (tile_quantizer.cuh's rowVectorAmaxOf). Unsmoothed, x is a rounded product of the input by one
  // factor, so |x| grows with |input| and the largest |x| is that of the largest |input|: exact, and a
  // quarter of the instructions. Smoothed, every element is computed.
  __device__ __forceinline__ float rowVectorAmax(int pass) const {
    if constexpr (kSmoothed) {
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        amax = fmaxf(amax, fabsf((*this)(pass, j)));
      return amax;
    } else {
      const float largest = maxMagnitudeOf(tile.raw[pass]);
      if constexpr (kPrescaled)
        return fabsf(__fmul_rn(largest, prescale)); // round to nearest is odd-symmetric: any sign of the factor
      else
        return largest;
    }
  }
};

// The Q block one CTA of a Q launch reads: `head` = batch index * heads_q + Q head index, `block` its index among the
// head's `blocks`; its rows start at firstRow() in the padded rows [b, h_q, padded_q] of q_codes (and FP4's q_scales).
struct QBlockAt {
  int blocks;
  long long head;
  int block;

  __device__ __forceinline__ long long firstRow(const SagePrologueParams &params) const {
    return head * params.size.padded_q + (long long)block * kBlockQ;
  }
};

__device__ __forceinline__ QBlockAt qBlockAt(const SagePrologueParams &params, long long cta) {
  const int blocks = params.size.padded_q / kBlockQ;
  return {blocks, cta / blocks, (int)(cta % blocks)};
}

// Loads Q block `block` of head `head` (= batch index * heads_q + head index); when Q is smoothed, computes its
// mean, stored to q_mean when `store_mean`.
template <bool kPrescaled, bool kSmoothed>
__device__ __forceinline__ void loadQBlock(QBlockOf<kPrescaled, kSmoothed> &q, const SagePrologueParams &params,
                                           long long head, int block, [[maybe_unused]] unsigned char *shared,
                                           [[maybe_unused]] bool store_mean) {
  const SequenceRows rows = queryRows(params, head);
  // 0 for a block past a packed sequence (a dense call's blocks all start inside its tokens): zero codes, mean 0.
  q.valid_rows = max(0, min(kBlockQ, rows.length - block * kBlockQ));
  q.tile.load(rows.rows + (long long)block * kBlockQ * rows.token_stride, rows.token_stride, q.valid_rows);
  if constexpr (kPrescaled)
    q.prescale = params.q_prescale;
  if constexpr (kSmoothed) {
    // Q smoothing: the block's per-channel mean of x over its tokens inside the sequence.
    float *block_mean = (float *)(shared + kTileMeansOffset);
    tileColumnMeans<TokenTile<kBlockQ>>([&](int pass, int j) { return q.scaled(pass, j); }, q.valid_rows,
                                        (float *)shared, block_mean);
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      q.mean[j] = block_mean[TokenTile<kBlockQ>::channel() + j];
    if (store_mean) {
      float *q_mean =
          workspaceFloats(params, params.offsets.q_mean) + (head * (params.size.padded_q / kBlockQ) + block) * kHeadDim;
      for (int c = threadIdx.x; c < kHeadDim; c += kThreads)
        q_mean[c] = block_mean[c];
    }
  }
}

} // namespace sage::device::prologue
