// The quantization prologue's psi_Q on one Q block (launch 1) with one scale per group of rows. QBlock is the
// variant's QBlockOf<...>, Quantizer its QQuantizer. The prologue generator pastes this header after its constants,
// its quantizer structs, q_block.cuh and tile_quantizer.cuh, whose names it uses (q_cast.cuh, q_per_tensor.cuh and
// q_fp4_quantize.cuh hold the other kinds of psi_Q).
#pragma once

namespace sage::device::prologue {

// psi_Q on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's q_scales (and q_mean).
template <class QBlock, class Quantizer>
__device__ __forceinline__ void quantizeQBlockOf(const SagePrologueParams &params, long long cta,
                                                 unsigned char *shared) {
  const int blocks = params.size.padded_q / kBlockQ;
  const long long head = cta / blocks; // batch index * heads_q + Q head index
  const int block = (int)(cta % blocks);
  QBlock q;
  unsigned char *codes =
      params.workspace + params.offsets.q_codes + (head * params.size.padded_q + (long long)block * kBlockQ) * kHeadDim;
  loadQBlock(q, params, head, block, shared, true);
  float *scales = workspaceFloats(params, params.offsets.q_scales) + head * params.size.q_scale_count +
                  (long long)block * Quantizer::kGroupsPerTile;
  quantizeTile<Quantizer>(q, codes, scales, kBlockQ, Quantizer::kGroupsPerTile, shared);
}

} // namespace sage::device::prologue
