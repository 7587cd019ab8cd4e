// The quantization prologue's FP4 psi_Q on one Q block (launch 1): e2m1 codes into q_codes [b, h_q, padded_q, d / 2]
// and microscales into q_scales [b, h_q, padded_q, d / Quantizer::kGroupChannels] (padded rows 0; and q_mean). QBlock
// is the variant's QBlockOf<...>, Quantizer its QQuantizer. The prologue generator pastes this header after its
// constants, q_block.cuh and microscaled_tile.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

template <class QBlock, class Quantizer>
__device__ __forceinline__ void quantizeFp4QBlockOf(const SagePrologueParams &params, long long cta,
                                                    unsigned char *shared) {
  const QBlockAt at = qBlockAt(params, cta);
  QBlock q;
  const long long first_row = at.firstRow(params);
  unsigned char *codes = params.workspace + params.offsets.q_codes + first_row * (kHeadDim / 2);
  unsigned char *scales =
      params.workspace + params.offsets.q_scales + first_row * (kHeadDim / Quantizer::kGroupChannels);
  loadQBlock(q, params, at.head, at.block, shared, true);
  storeMicroscaledTile<Quantizer>(q, codes, scales, kBlockQ);
}

} // namespace sage::device::prologue
