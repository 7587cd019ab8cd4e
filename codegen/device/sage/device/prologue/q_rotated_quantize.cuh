// The quantization prologue's psi_Q on one Q block (launch 1) with one scale per group of rows, of the rotated x
// (issue 28): q_quantize.cuh's role with rotateTile between the load and psi. QBlock is the variant's QBlockOf<...>,
// Quantizer its QQuantizer. The prologue generator pastes this header, for a rotated variant only, after its
// constants, its quantizer structs, q_block.cuh, tile_quantizer.cuh, rotation.cuh and q_quantize.cuh, whose names it
// uses.
#pragma once

namespace sage::device::prologue {

// psi_Q(x R_Q) on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's q_scales (and q_mean, the
// mean of the unrotated x: Q smoothing's correction multiplies it with the unrotated K).
template <class QBlock, class Quantizer>
__device__ __forceinline__ void quantizeRotatedQBlockOf(const SagePrologueParams &params, long long cta,
                                                        unsigned char *shared) {
  quantizeQBlockOf<QBlock, Quantizer>(params, cta, shared,
                                      [](const QBlock &q) { return rotateTile<kBlockQ, false>(q); });
}

} // namespace sage::device::prologue
