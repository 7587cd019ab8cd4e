// The quantization prologue's psi_Q on one Q block (launch 1) with one scale per group of rows. QBlock is the
// variant's QBlockOf<...>, Quantizer its QQuantizer. The prologue generator pastes this header after its constants,
// its quantizer structs, q_block.cuh and tile_quantizer.cuh, whose names it uses (q_cast.cuh, q_per_tensor.cuh and
// q_fp4_quantize.cuh hold the other kinds of psi_Q).
#pragma once

namespace sage::device::prologue {

// The Q block itself as psi_Q's x (q_rotated_quantize.cuh passes the rotation instead).
struct QBlockAsIs {
  template <class QBlock> __device__ __forceinline__ const QBlock &operator()(const QBlock &q) const { return q; }
};

// psi_Q on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's q_scales (and q_mean), of
// x = transform(the block).
template <class QBlock, class Quantizer, class Transform = QBlockAsIs>
__device__ __forceinline__ void quantizeQBlockOf(const SagePrologueParams &params, long long cta, unsigned char *shared,
                                                 Transform transform = {}) {
  const QBlockAt at = qBlockAt(params, cta);
  QBlock q;
  unsigned char *codes = params.workspace + params.offsets.q_codes + at.firstRow(params) * kHeadDim;
  loadQBlock(q, params, at.head, at.block, shared, true);
  const auto &x = transform(q);
  float *scales = workspaceFloats(params, params.offsets.q_scales) + at.head * params.size.q_scale_count +
                  (long long)at.block * Quantizer::kGroupsPerTile;
  quantizeTile<Quantizer>(x, codes, scales, kBlockQ, Quantizer::kGroupsPerTile, shared);
}

} // namespace sage::device::prologue
