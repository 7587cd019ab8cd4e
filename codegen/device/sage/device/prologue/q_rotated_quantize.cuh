// The quantization prologue's psi_Q on one Q block (launch 1) with one scale per group of rows, of the rotated x
// (issue 28): q_quantize.cuh's role with rotateTile between the load and psi. QBlock is the variant's QBlockOf<...>,
// Quantizer its QQuantizer. The prologue generator pastes this header, for a rotated variant only, after its
// constants, its quantizer structs, q_block.cuh, tile_quantizer.cuh and rotation.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// psi_Q(x R_Q) on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's q_scales (and q_mean, the
// mean of the unrotated x: Q smoothing's correction multiplies it with the unrotated K).
template <class QBlock, class Quantizer>
__device__ __forceinline__ void quantizeRotatedQBlockOf(const SagePrologueParams &params, long long cta,
                                                        unsigned char *shared) {
  const int blocks = params.size.padded_q / kBlockQ;
  const long long head = cta / blocks; // batch index * heads_q + Q head index
  const int block = (int)(cta % blocks);
  QBlock q;
  unsigned char *codes =
      params.workspace + params.offsets.q_codes + (head * params.size.padded_q + (long long)block * kBlockQ) * kHeadDim;
  loadQBlock(q, params, head, block, shared, true);
  const RotatedTile<kBlockQ> x = rotateTile<kBlockQ, false>(q);
  float *scales = workspaceFloats(params, params.offsets.q_scales) + head * params.size.q_scale_count +
                  (long long)block * Quantizer::kGroupsPerTile;
  quantizeTile<Quantizer>(x, codes, scales, kBlockQ, Quantizer::kGroupsPerTile, shared);
}

} // namespace sage::device::prologue
