// The quantization prologue's stand-in for psi_Q when Q is not quantized (granularity none): a cast of one Q block
// (launch 1). QBlock is the variant's QBlockOf<...>, Quantizer its QQuantizer. The prologue generator pastes this
// header after its constants, its quantizer structs, q_block.cuh and tile_quantizer.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// Q is not quantized: x rounded to the input type (round to nearest even) into q_codes [b, h_q, padded_q, d], 2 bytes
// per value, padded rows 0 (and q_mean).
template <class QBlock, class Quantizer>
__device__ __forceinline__ void castQBlockOf(const SagePrologueParams &params, long long cta, unsigned char *shared) {
  const QBlockAt at = qBlockAt(params, cta);
  QBlock q;
  unsigned short *values =
      (unsigned short *)(params.workspace + params.offsets.q_codes) + at.firstRow(params) * kHeadDim;
  loadQBlock(q, params, at.head, at.block, shared, true);
  storeTileValues<Quantizer>(q, values, kBlockQ);
}

} // namespace sage::device::prologue
