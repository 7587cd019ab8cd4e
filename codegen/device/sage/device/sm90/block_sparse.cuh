// Block-sparse masks in the sm90 attention kernel: the CTA's row of block_mask[b, h, i, :] (1 = visit) is read once,
// before the warp roles split, into a bitmask in shared memory; the producer and every consumer then walk the same
// kept KV blocks in the same order, so that pipeline position p holds the same block for all of them. Rows longer
// than the bitmask (more than kKeptBlockCapacity blocks: 1M tokens at b_kv = 64) read the rest from global memory,
// slowly but with the same answers.
#pragma once

#include "sage/device/sm90/tiles.cuh"

namespace sage::device::sm90 {

// Where the CTA's mask row is: the bitmask in shared memory and, past its capacity, the row itself (null: no mask,
// every block is kept).
struct KeptBlocks {
  const unsigned *bits;     // bit j of word j / 32: block j is kept ([0, block_end) only; 0 past it)
  const unsigned char *row; // block_mask[b, h, i, :], or null
  int block_end;            // blocks from here on are never visited (the row's end)

  // The first kept block >= `block`, or block_end. Warp-uniform: every lane reads the same words.
  __device__ __forceinline__ int next(int block) const {
    while (block < block_end) {
      if (block < kKeptBlockCapacity) {
        const unsigned word = bits[block / 32] >> (block % 32);
        if (word != 0u)
          return block + __ffs(static_cast<int>(word)) - 1;
        block = (block / 32 + 1) * 32;
      } else {
        if (!row || row[block] != 0)
          return block;
        ++block;
      }
    }
    return block_end;
  }
};

// Fills the CTA's bitmask from its mask row; all threads of the CTA call it, and read it after a __syncthreads.
// Each warp reads 32 consecutive mask bytes at a time (one coalesced load) and ballots them into one word.
template <class Config>
__device__ __forceinline__ KeptBlocks collect_kept_blocks(const SageAttentionParams &params,
                                                          const TileCoordinates &tile, unsigned *bits) {
  const SageProblemSize &size = params.size;
  const int q_blocks = (size.tokens_q + Config::kBlockQ - 1) / Config::kBlockQ;
  const unsigned char *row = params.block_mask ? params.block_mask + (tile.q_head_index * q_blocks + tile.q_block) *
                                                                         static_cast<long long>(tile.kv_blocks)
                                               : nullptr;
  const int covered = min(tile.block_end, kKeptBlockCapacity);
  const int words = (covered + 31) / 32;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (int word = warp; word < words; word += static_cast<int>(blockDim.x) / 32) {
    const int block = word * 32 + lane;
    const bool kept = block < covered && (!row || row[block] != 0);
    const unsigned ballot = __ballot_sync(0xffffffffu, kept);
    if (lane == 0)
      bits[word] = ballot;
  }
  return KeptBlocks{bits, row, tile.block_end};
}

} // namespace sage::device::sm90
