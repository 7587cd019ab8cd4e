// The quantization prologue's psi_Q with one scale per tensor: launch 1 measures each Q block's amax
// (measureQBlockOf), launch 2 combines them and quantizes (quantizePerTensorQBlockOf). QBlock is the variant's
// QBlockOf<...>, Quantizer its QQuantizer. The prologue generator pastes this header, for a per-tensor psi_Q only,
// after its constants, its quantizer structs, its statistics scratch (statisticsScratch), q_block.cuh,
// tile_reductions.cuh and tile_quantizer.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// Launch 1: the amax of one Q block's x, kept in prologue_statistics for launch 2 to combine (and q_mean).
template <class QBlock>
__device__ __forceinline__ void measureQBlockOf(const SagePrologueParams &params, long long cta,
                                                unsigned char *shared) {
  const QBlockAt at = qBlockAt(params, cta);
  QBlock q;
  loadQBlock(q, params, at.head, at.block, shared, true);
  const float amax = tileAmax<TokenTile<kBlockQ>>(q, (unsigned *)(shared + kTileGroupAmaxOffset));
  if (threadIdx.x == 0)
    statisticsScratch(params).q_amax[at.head * at.blocks + at.block] = amax;
}

// Launch 2, on the second read of a Q block: the amax is the max of launch 1's block amax (every block computes the
// same); block 0 stores scale = amax / qmax.
template <class QBlock, class Quantizer>
__device__ __forceinline__ void quantizePerTensorQBlockOf(const SagePrologueParams &params, long long cta,
                                                          unsigned char *shared) {
  const QBlockAt at = qBlockAt(params, cta);
  QBlock q;
  unsigned char *codes = params.workspace + params.offsets.q_codes + at.firstRow(params) * kHeadDim;
  loadQBlock(q, params, at.head, at.block, shared, false);
  const float *block_amax = statisticsScratch(params).q_amax + at.head * at.blocks;
  float amax = 0.0f;
  for (int b = threadIdx.x; b < at.blocks; b += kThreads)
    amax = fmaxf(amax, block_amax[b]);
  amax = ctaMax(amax, (unsigned *)(shared + kTileGroupAmaxOffset));
  const SymmetricScale scale = symmetricScale(amax, Quantizer::kCodeMax);
  if (at.block == 0 && threadIdx.x == 0)
    workspaceFloats(params, params.offsets.q_scales)[at.head] = scale.scale;
  storeTileCodes<Quantizer>(q, codes, kBlockQ, [&](int) { return scale.inverse; });
}

} // namespace sage::device::prologue
