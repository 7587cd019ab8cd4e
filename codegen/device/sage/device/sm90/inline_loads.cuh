// The sm90 kernel without a producer warpgroup (Config::kInlineLoads; sage2-fp8 by default): one consumer
// warpgroup per CTA that issues its own TMA loads, with the packed-sequence bounds it keeps in shared memory.
// attention_kernel<Config> (attention.cuh) runs consume_inline for such a Config.
#pragma once

#include "sage/device/sm90/block_steps.cuh"

namespace sage::device::sm90 {

// Packed sequences, inline loads: the tile's KV length, causal offset and block ends (the values a dense kernel reads
// from the constant bank) wait in shared memory, in the alignment slack where a persistent CTA keeps its tile slot,
// and are read where the KV loop uses them instead of held in registers through it (held, ptxas spilled 56 bytes for
// sage2-fp8 d128). Written by thread 0 before the CTA's first barrier.
template <class Config> struct InlineTileBounds {
  static_assert(SharedLayout<Config>::kTileSlotOffset % 16 == 0, "st.shared.v4 needs 16-byte alignment");
  // shared-window address of 4 ints: tokens_kv, causal_offset, block_end, min(unmasked_end, block_end) (the blocks
  // before it need no mask)
  unsigned address;
  __device__ __forceinline__ void store(const TileCoordinates &tile, int unmasked_end) const {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "r"(tile.tokens_kv),
                 "r"(tile.causal_offset), "r"(tile.block_end), "r"(unmasked_end)
                 : "memory");
  }
  // Read again at every use (volatile): the value is not kept live across the loop
  __device__ __forceinline__ int load(int index) const {
    int value;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(value) : "r"(address + 4 * index) : "memory");
    return value;
  }
};

// The kernel without a producer warpgroup (Config::kInlineLoads): one warpgroup, one tile, which issues its own TMA
// loads: Q_i and the first kStages blocks up front (thread 0), then K_(j+kStages) while P~_j V_j runs and
// V_(j+kStages) as block j + 1 starts (see `refill_k`). Each block runs in order: S_j = Q K_j^T, its softmax, P~_j V_j,
// the product folded into O. S_j and the P.V's product are never live together, so a thread needs ~170 registers and
// three CTAs share an SM: their GEMMs and softmaxes interleave as the warp schedulers pick (SageAttention2's sm90
// kernel is built this way).
template <class Config>
__device__ __forceinline__ void consume_inline(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                               unsigned shared_base, const StageBarriers<Config> &barriers) {
  static_assert(Config::kConsumers == 1 && !Config::kPersistent && !Config::kBlockSparse,
                "inline loads: one consumer warpgroup, one dense tile per CTA");
  using Layout = SharedLayout<Config>;
  using Accumulator = Select<Config::kQk == QkOperands::int8, int, float>;
  const SageAttentionParams &base = params.base;
  const SageProblemSize &size = base.size;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32, lane = thread % 32, quad_lane = lane % 4;
  const int rows[2] = {tile.q_begin + warp * 16 + lane / 4, tile.q_begin + warp * 16 + lane / 4 + 8};
  const InlineTileBounds<Config> bounds{shared_base + SharedLayout<Config>::kTileSlotOffset};
  // The loop's bounds: dense, the tile's (from the constant bank); packed, from shared memory at each use
  auto block_end = [&] { return Config::kPackedSequences ? bounds.load(2) : tile.block_end; };
  const int tile_unmasked_end = Config::kPackedSequences ? 0 : unmasked_block_end<Config>(tile, tile.q_begin);
  // (packed: already at most block_end, which changes no comparison below)
  auto unmasked_end = [&] { return Config::kPackedSequences ? bounds.load(3) : tile_unmasked_end; };
  auto loop_tile = [&] {
    TileCoordinates masked = tile;
    if constexpr (Config::kPackedSequences) {
      masked.tokens_kv = bounds.load(0);
      masked.causal_offset = bounds.load(1);
    }
    return masked;
  };
  auto stage_base = [&](int block) {
    return shared_base + Layout::kStageOffset + (block % Config::kStages) * Layout::kStageBytes;
  };
  if (thread == 0) {
    load_q<Config>(params, tile, shared_base, barriers);
    for (int block = 0; block < min(block_end(), Config::kStages); ++block) {
      load_k<Config>(params, tile, block, stage_base(block), barriers.full_k(block));
      load_v<Config>(params, tile, block, stage_base(block), barriers.full_v(block));
    }
  }
  ConsumerState<Config> state;
  start_consumer<Config>(state, base, tile, rows);
  const float *k_scales =
      reinterpret_cast<const float *>(base.workspace + base.offsets.k_scales) + tile.kv_head_index * size.k_scale_count;
  const unsigned q_tile = shared_base + Layout::kQOffset;
  using BlockScales = typename CodesSoftmax<Config>::BlockScales;

  Accumulator accumulator[Config::kBlockKv / 2];
  float scores[Config::kBlockKv / 2];
  float rescale[2];
  ProbabilityFragments<Config> p;
  int block_product[Config::kPv == PvOperands::int8 ? ConsumerState<Config>::kOutputChannels / 2 : 1];
  mbarrier_wait(barriers.q_full(), 0);
  // Warp 0 refills a released stage where its wait is (nearly) free: K_j's right after issuing P~_j V_j, V_j's as block
  // j + 1 starts. Every thread arrived on K_j's empty barrier before that wgmma, which they issue together, and on
  // V_j's as they left its wait together. The whole warp waits (a warp-uniform branch: its lanes stay converged, so
  // the next wgmma needs no reconvergence) and one elected lane issues. Refilling each stage from thread 0 as soon as
  // it was released kept the other warps waiting for warp 0 at the next wgmma (H200, ncu, sage2-fp8 d128 at 16k
  // tokens: 11% of the stall samples on the P.V's first wgmma, 3.94 against 3.41 ms with warp-uniform refills). These
  // places also keep ptxas within 168 registers without spills; K's refill at the loop's top spilled 64 bytes.
  const int warp_uniform = __shfl_sync(0xffffffffu, warp, 0);
  auto refills = [&](int block) { // whether warp 0 refills the stage of `block` with block + kStages
    return warp_uniform == 0 && block >= 0 && block + Config::kStages < block_end();
  };
  auto refill_k = [&](int block) {
    if (!refills(block))
      return;
    mbarrier_wait(barriers.empty_k(block), StageBarriers<Config>::phase(block));
    if (elect_one_sync())
      load_k<Config>(params, tile, block + Config::kStages, stage_base(block), barriers.full_k(block));
    __syncwarp();
  };
  auto refill_v = [&](int block) {
    if (!refills(block))
      return;
    mbarrier_wait(barriers.empty_v(block), StageBarriers<Config>::phase(block));
    if (elect_one_sync())
      load_v<Config>(params, tile, block + Config::kStages, stage_base(block), barriers.full_v(block));
    __syncwarp();
  };
  auto run_block = [&](int block, bool masked) { // causal: inlined twice, `masked` a constant
    const unsigned phase = StageBarriers<Config>::phase(block);
    BlockScales block_scales{};
    if constexpr (CodesSoftmax<Config>::kApplies)
      block_scales = CodesSoftmax<Config>::load(k_scales, size.k_scale_count, block * Config::kBlockKv);
    refill_v(block - 1);
    mbarrier_wait(barriers.full_k(block), phase);
    issue_q_k<Config>(accumulator, q_tile, stage_base(block) + Layout::kKOffset);
    wgmma_wait_group<0>();
    warpgroup_fence_operands(accumulator);
    mbarrier_arrive(barriers.empty_k(block)); // K_j is no longer read
    if (masked)
      score_block<Config, true>(state, scores, accumulator, size, loop_tile(), k_scales, block_scales, rows,
                                block * Config::kBlockKv, quad_lane, rescale);
    else
      score_block<Config, false>(state, scores, accumulator, size, tile, k_scales, block_scales, rows,
                                 block * Config::kBlockKv, quad_lane, rescale);
    pack_probabilities<Config>(p, scores);
    rescale_output(state, rescale);
    mbarrier_wait(barriers.full_v(block), phase);
    const unsigned v_tile = stage_base(block) + Layout::kVOffset;
    // Column slices folded one at a time (kSlicedFold: head_dim > 128 with an outer sum), else one group
    constexpr int kFolds = ConsumerState<Config>::kSlicedFold ? ValueSlices<Config>::kCount : 1;
#pragma unroll
    for (int slice = 0; slice < kFolds; ++slice) {
      issue_block_p_v<Config>(state, block_product, p, v_tile, slice);
      if (slice == 0)
        refill_k(block);
      wgmma_wait_group<0>();
      fence_p_v_registers<Config>(state, block_product, p);
      if (slice == kFolds - 1)
        mbarrier_arrive(barriers.empty_v(block)); // V_j is no longer read
      finish_block(state, block_product, slice);
    }
  };
  // Causal: the blocks that need no mask first, then those that cross the diagonal or the sequence's end, each loop
  // with one softmax path (one loop with both spilled 88 bytes at d128, these two 8). Without the causal mask one loop
  // with both paths keeps ptxas within its 168 registers without spills (two loops spilled 44 bytes).
  if constexpr (Config::kCausal) {
    int block = 0;
    for (; block < (Config::kPackedSequences ? unmasked_end() : min(unmasked_end(), block_end())); ++block)
      run_block(block, false);
    for (; block < block_end(); ++block)
      run_block(block, true);
  } else {
    for (int block = 0; block < block_end(); ++block)
      run_block(block, block >= unmasked_end());
  }
  write_results<Config>(state, params, tile, rows, quad_lane);
}

} // namespace sage::device::sm90
