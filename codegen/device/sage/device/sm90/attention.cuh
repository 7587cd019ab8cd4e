// The sm90 attention kernel: SageAttention's quantized attention on Hopper's warpgroup MMA, fed by TMA through an
// mbarrier pipeline, with warp specialisation (the FlashAttention-3 recipe).
//
//   warpgroup 0      producer: one thread issues the TMA loads of Q_i (once) and of K_j, V_j into kStages
//                    shared-memory stages; it gives most of its registers to the consumers (setmaxnreg).
//   warpgroups 1..C  consumers: each owns 64 rows of Q_i. Per KV block j:
//                      S = Q_i K_j^T                 wgmma, A and B from shared memory (s8 or f16/bf16)
//                      S = psi^-1(S) in base 2       delta_Q per row, delta_K per column
//                      m, P~ = exp2(S - m), l        online softmax, P~ never leaves the registers
//                      O = diag(exp2(m' - m)) O + P~ V_j   wgmma, A = P~ from registers, B = V_j from shared memory
//                    and release the stage to the producer.
//
// The generator instantiates attention_kernel<Config> with a Config struct of constants (see the generated
// source); everything a variant decides is a constant there, so the compiler removes the unused paths.
//
// 8-bit P.V: the S accumulator gives a thread columns 8j + 2t, 8j + 2t + 1 while the A operand of an 8-bit wgmma
// wants 4 consecutive k. P~ is packed without moving data (columns 8j + 2t.. of tiles 4s, 4s + 1 form k = 4t..4t + 3
// of step s), and the prologue wrote V^T with its tokens in the matching order (VCodesTokenOrder::wgmma_interleaved).
#pragma once

#include "sage/device/sm90/accumulation.cuh"
#include "sage/device/sm90/block_sparse.cuh"
#include "sage/device/sm90/block_steps.cuh"
#include "sage/device/sm90/common.cuh"
#include "sage/device/sm90/inline_loads.cuh"
#include "sage/device/sm90/mbarrier.cuh"
#include "sage/device/sm90/softmax.cuh"
#include "sage/device/sm90/tiles.cuh"
#include "sage/device/sm90/tma.cuh"
#include "sage/device/sm90/warpgroup.cuh"
#include "sage/device/sm90/wgmma_instructions.cuh"

namespace sage::device::sm90 {

// The producer's loads of one tile: K_j and V_j for every visited block j into stage (position % kStages), each as
// soon as the consumers released that stage's K or V. `position` counts the CTA's visited blocks over all its tiles.
template <class Config>
__device__ __forceinline__ void produce_tile(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                             const VisitedBlocks<Config> &visits, unsigned shared_base,
                                             const StageBarriers<Config> &barriers, int &position) {
  using Layout = SharedLayout<Config>;
  for (int block = visits.next(0); block < visits.block_end; block = visits.next(block + 1), ++position) {
    // A fresh barrier passes parity 1: the first kStages loads go straight out.
    const unsigned released = StageBarriers<Config>::phase(position) ^ 1u;
    const unsigned stage_base = shared_base + Layout::kStageOffset + (position % Config::kStages) * Layout::kStageBytes;
    mbarrier_wait_suspended(barriers.empty_k(position), released);
    load_k<Config>(params, tile, block, stage_base, barriers.full_k(position));
    mbarrier_wait_suspended(barriers.empty_v(position), released);
    load_v<Config>(params, tile, block, stage_base, barriers.full_v(position));
  }
}

// The producer of a persistent CTA: it claims its tiles one ahead (the next while it loads this one). For each, once
// the consumers have read the previous tile's Q for the last time, it tells them both claims (the tile slot, published
// by tile_full, so that they set the tile up while Q_i is in flight), then loads Q_i and the tile's K/V stages (which
// may run ahead into the next tile's first blocks). tile_full's next phase waits for q_empty, so it never runs two
// phases ahead of a consumer's wait.
template <class Config>
__device__ __forceinline__ void produce(const SageSm90AttentionParams &params, const TileSchedule<Config> &schedule,
                                        unsigned shared_base, const StageBarriers<Config> &barriers) {
  using Layout = SharedLayout<Config>;
  int position = 0;
  int index = schedule.claim(params.tile_counter, params.base);
  for (int iteration = 0;; ++iteration) {
    const int next = index < schedule.tiles ? schedule.claim(params.tile_counter, params.base) : schedule.tiles;
    mbarrier_wait_suspended(barriers.q_empty(), StageBarriers<Config>::phase_of(iteration) ^ 1u);
    asm volatile("st.shared.v2.s32 [%0], {%1, %2};\n" ::"r"(shared_base + Layout::kTileSlotOffset), "r"(index),
                 "r"(next)
                 : "memory");
    mbarrier_arrive(shared_base + Layout::kTileFullOffset); // releases the slot's store
    if (index >= schedule.tiles)                            // no tile: the consumers read that and return
      return;
    const TileCoordinates tile = schedule.coordinates(index, params.base);
    load_q<Config>(params, tile, shared_base, barriers);
    VisitedBlocks<Config> visits{};
    visits.block_end = tile.block_end;
    produce_tile<Config>(params, tile, visits, shared_base, barriers, position);
    if (next >= schedule.tiles)
      return;
    index = next;
  }
}

// Two consumer warpgroups take turns at the tensor cores (ping-pong): each issues its wgmma between a sync on its
// own named barrier and an arrive on the other's, so one warpgroup's softmax runs while the other's GEMMs do.
template <class Config> struct TurnTaking {
  static constexpr bool kEnabled = Config::kConsumers == 2;
  static constexpr int kFirstBarrier = 1; // 0 is __syncthreads'
  int consumer;
  __device__ __forceinline__ void start() const {
    if constexpr (kEnabled)
      if (consumer == 1) // consumer 0 goes first
        named_barrier_arrive(kFirstBarrier, 2 * kWarpgroupThreads);
  }
  __device__ __forceinline__ void wait_turn() const {
    if constexpr (kEnabled)
      named_barrier_sync(kFirstBarrier + consumer, 2 * kWarpgroupThreads);
  }
  // `last`: consumer 1's final turn hands over to nobody (consumer 0 has no turn left to wait for).
  __device__ __forceinline__ void pass_turn(bool last) const {
    if constexpr (kEnabled)
      if (!(last && consumer == 1))
        named_barrier_arrive(kFirstBarrier + 1 - consumer, 2 * kWarpgroupThreads);
  }
};

// A consumer warpgroup's main loop, software-pipelined by one P.V: in step j it issues S_j = Q K_j^T and
// O += P~_(j-1) V_(j-1) back to back, then computes the softmax of S_j while the P.V runs (kSoftmaxUnderProduct; else
// after it, when the P.V's product and S_j would not both fit the registers), then packs P~_j.
// Every consumer visits the CTA's blocks (rows past a block's reach see it fully masked; block-sparse: the kept blocks
// of the CTA's one mask row), so the pipeline's phases and the ping-pong's turns match between consumers. `position`
// counts the tile's visited blocks, `first_position` the CTA's visited blocks before this tile (both pick the stage
// and the phase); `block` is the KV block at that position. `iteration`: the CTA's tiles before this one; `last`: this
// is its last tile. Returns the number of blocks visited.
template <class Config>
__device__ __forceinline__ int consume(const SageSm90AttentionParams &params, const TileCoordinates &tile,
                                       const VisitedBlocks<Config> &visits, unsigned shared_base,
                                       const StageBarriers<Config> &barriers, int consumer,
                                       const TurnTaking<Config> &turns, int first_position, int iteration, bool last) {
  static_assert(!ConsumerState<Config>::kSlicedFold,
                "an outer sum over column slices of O runs with inline loads (the schedule plans it so)");
  using Layout = SharedLayout<Config>;
  using Accumulator = Select<Config::kQk == QkOperands::int8, int, float>;
  const SageAttentionParams &base = params.base;
  const SageProblemSize &size = base.size;
  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32, lane = thread % 32, quad_lane = lane % 4;
  const int consumer_row = tile.q_begin + consumer * 64;
  const int rows[2] = {consumer_row + warp * 16 + lane / 4, consumer_row + warp * 16 + lane / 4 + 8};
  const unsigned char *workspace = base.workspace;

  ConsumerState<Config> state;
  start_consumer<Config>(state, base, tile, rows);
  const float *k_scales =
      reinterpret_cast<const float *>(workspace + base.offsets.k_scales) + tile.kv_head_index * size.k_scale_count;
  const int unmasked_end = unmasked_block_end<Config>(tile, consumer_row);
  const unsigned q_tile = shared_base + Layout::kQOffset + consumer * 64 * Layout::kQkChunkBytes;
  // Pipeline positions of this tile's blocks, counted over all of the CTA's tiles.
  auto stage_base = [&](int position) {
    return shared_base + Layout::kStageOffset + ((first_position + position) % Config::kStages) * Layout::kStageBytes;
  };
  auto full_k = [&](int position) { return barriers.full_k(first_position + position); };
  auto full_v = [&](int position) { return barriers.full_v(first_position + position); };
  auto phase = [&](int position) { return StageBarriers<Config>::phase(first_position + position); };
  // Q_i is read for the last time by the tile's last S (a persistent CTA's producer then loads the next tile's Q).
  auto release_q = [&] {
    if constexpr (Config::kPersistent)
      mbarrier_arrive(barriers.q_empty());
  };
  // The next visited block, broadcast from lane 0 so that ptxas sees the loop's trip count as warp-uniform (a wgmma
  // under a branch it considers divergent gets serialized: C7518).
  auto next_block = [&](int block) {
    if constexpr (Config::kBlockSparse)
      return __shfl_sync(0xffffffffu, visits.next(block), 0);
    else
      return block;
  };

  mbarrier_wait(barriers.q_full(), StageBarriers<Config>::phase_of(iteration)); // Q_i
  const int block_end = visits.block_end;
  Accumulator accumulator[Config::kBlockKv / 2];
  float scores[Config::kBlockKv / 2];
  float rescale[2];
  ProbabilityFragments<Config> p;
  int block_product[Config::kPv == PvOperands::int8 ? ConsumerState<Config>::kOutputChannels / 2 : 1];
  // S_j (waited for) -> P~_j's f32 scores, then P~_j packed once the previous P.V no longer reads P~'s registers.
  using BlockScales = typename CodesSoftmax<Config>::BlockScales;
  auto load_scales = [&](int block) {
    if constexpr (CodesSoftmax<Config>::kApplies)
      return CodesSoftmax<Config>::load(k_scales, size.k_scale_count, block * Config::kBlockKv);
    else
      return BlockScales{};
  };
  auto score = [&](int block, const BlockScales &block_scales) {
    const int kv_begin = block * Config::kBlockKv;
    if (block >= unmasked_end)
      score_block<Config, true>(state, scores, accumulator, size, tile, k_scales, block_scales, rows, kv_begin,
                                quad_lane, rescale);
    else
      score_block<Config, false>(state, scores, accumulator, size, tile, k_scales, block_scales, rows, kv_begin,
                                 quad_lane, rescale);
  };
  // O += P~_j V_j: rescale O to m_j, issue; the caller passes the turn and waits.
  auto issue_product = [&](int position) {
    rescale_output(state, rescale);
    const unsigned v_tile = stage_base(position) + Layout::kVOffset;
    issue_block_p_v<Config>(state, block_product, p, v_tile);
  };
  // After the P.V of block j completed: fence its registers; release V_j's stage; fold the product.
  auto fence_product = [&] { fence_p_v_registers<Config>(state, block_product, p); };
  auto finish_product = [&](int position) {
    mbarrier_arrive(barriers.empty_v(first_position + position)); // V_j is no longer read
    finish_block(state, block_product);
  };

  // The loop is peeled so that its body issues every wgmma unconditionally (ptxas serializes wgmma whose register
  // dependences it cannot follow through branches).
  const int first_block = next_block(0);
  int position = 1; // after the loop: the number of visited blocks (when there was one)
  if (first_block < block_end) {
    const BlockScales block_scales = load_scales(first_block);
    mbarrier_wait(full_k(0), phase(0));
    turns.wait_turn();
    issue_q_k<Config>(accumulator, q_tile, stage_base(0) + Layout::kKOffset);
    turns.pass_turn(false);
    const int second_block = next_block(first_block + 1);
    wgmma_wait_group<0>();
    warpgroup_fence_operands(accumulator);
    mbarrier_arrive(barriers.empty_k(first_position)); // K_0 is no longer read
    if (second_block >= block_end)
      release_q();
    score(first_block, block_scales);
    pack_probabilities<Config>(p, scores);
    for (int block = second_block, following; block < block_end; block = following, ++position) {
      // S_j = Q K_j^T and O += P~_(j-1) V_(j-1) back to back; the softmax of S_j runs while the P.V does.
      const BlockScales block_scales = load_scales(block);
      mbarrier_wait(full_k(position), phase(position));
      mbarrier_wait(full_v(position - 1), phase(position - 1));
      turns.wait_turn();
      issue_q_k<Config>(accumulator, q_tile, stage_base(position) + Layout::kKOffset);
      issue_product(position - 1);
      turns.pass_turn(false);
      following = next_block(block + 1); // the walk's shared-memory reads wait while the GEMMs run, not between steps
      if constexpr (Config::kSoftmaxUnderProduct) {
        wgmma_wait_group<1>(); // S_j has landed; the P.V may still run
        warpgroup_fence_operands(accumulator);
        mbarrier_arrive(barriers.empty_k(first_position + position)); // K_j is no longer read
        if (following >= block_end)
          release_q();
        score(block, block_scales);
        wgmma_wait_group<0>();
        fence_product();
        finish_product(position - 1);
      } else { // the P.V's product is folded before the softmax, so the two are never live together
        wgmma_wait_group<0>();
        warpgroup_fence_operands(accumulator);
        fence_product();
        mbarrier_arrive(barriers.empty_k(first_position + position));
        if (following >= block_end)
          release_q();
        finish_product(position - 1);
        score(block, block_scales);
      }
      pack_probabilities<Config>(p, scores);
    }
    mbarrier_wait(full_v(position - 1), phase(position - 1));
  } else {
    release_q();
  }
  turns.wait_turn();
  if (first_block < block_end)
    issue_product(position - 1);
  turns.pass_turn(last);
  // Waited for on every path, so that ptxas sees O complete before anything reads it (where it cannot tell, it
  // serializes every wgmma of the kernel: C7514).
  wgmma_wait_group<0>();
  fence_product();
  if (first_block < block_end)
    finish_product(position - 1);
  write_results<Config>(state, params, tile, rows, quad_lane);
  return first_block < block_end ? position : 0;
}

// A consumer warpgroup's tiles, in the order the producer loads them; the ping-pong's turns carry on across tiles.
// `grid_tile`: the tile of a CTA that is not persistent.
template <class Config>
__device__ __forceinline__ void consume_tiles(const SageSm90AttentionParams &params,
                                              const TileSchedule<Config> &schedule, const TileCoordinates &grid_tile,
                                              const VisitedBlocks<Config> &visits, unsigned shared_base,
                                              const StageBarriers<Config> &barriers, int consumer) {
  using Layout = SharedLayout<Config>;
  const TurnTaking<Config> turns{consumer};
  turns.start();
  if constexpr (!Config::kPersistent) {
    const TileCoordinates &tile = grid_tile;
    VisitedBlocks<Config> tile_visits = visits;
    tile_visits.block_end = tile.block_end;
    consume<Config>(params, tile, tile_visits, shared_base, barriers, consumer, turns, 0, 0, true);
    return;
  }
  int position = 0;
  for (int iteration = 0;; ++iteration) {
    // This tile and the next, as the producer claimed them (Q_i may still be in flight: consume waits for it).
    mbarrier_wait(shared_base + Layout::kTileFullOffset, StageBarriers<Config>::phase_of(iteration));
    int index, next;
    asm volatile("ld.shared.v2.s32 {%0, %1}, [%2];\n"
                 : "=r"(index), "=r"(next)
                 : "r"(shared_base + Layout::kTileSlotOffset)
                 : "memory");
    if (index >= schedule.tiles) // the CTA claimed no tile at all
      return;
    const TileCoordinates tile = schedule.coordinates(index, params.base);
    VisitedBlocks<Config> tile_visits = visits;
    tile_visits.block_end = tile.block_end;
    position += consume<Config>(params, tile, tile_visits, shared_base, barriers, consumer, turns, position, iteration,
                                next >= schedule.tiles);
    if (next >= schedule.tiles)
      return;
  }
}

template <class Config> __device__ __forceinline__ void attention_kernel(const SageSm90AttentionParams &params) {
  using Layout = SharedLayout<Config>;
  extern __shared__ __align__(1024) unsigned char shared_memory[];
  // Swizzled TMA boxes and wgmma descriptors need 1024-byte aligned tiles.
  const unsigned raw_base = static_cast<unsigned>(__cvta_generic_to_shared(shared_memory));
  const unsigned shared_base = (raw_base + 1023u) & ~1023u;
  const StageBarriers<Config> barriers{shared_base + Layout::kBarrierOffset};
  const TileSchedule<Config> schedule(params.base.size);
  static_assert(!(Config::kPackedSequences && Config::kBlockSparse), "packed sequences: no block-sparse mask rows");
  // The CTA's tile unless it is persistent (a persistent CTA claims its own)
  const TileCoordinates grid_tile = schedule.coordinates(0, params.base);
  if constexpr (Config::kPackedSequences && !Config::kPersistent)
    if (grid_tile.empty()) // past its sequence's end: the whole CTA leaves before any barrier exists
      return;

  if (threadIdx.x == 0) {
    for (int stage = 0; stage < Config::kStages; ++stage) {
      mbarrier_init(barriers.full_k(stage), 1); // the producer's expect_tx
      mbarrier_init(barriers.full_v(stage), 1);
      mbarrier_init(barriers.empty_k(stage), Config::kConsumers * kWarpgroupThreads);
      mbarrier_init(barriers.empty_v(stage), Config::kConsumers * kWarpgroupThreads);
    }
    mbarrier_init(barriers.q_full(), 1);
    mbarrier_init(barriers.q_empty(), Config::kConsumers * kWarpgroupThreads);
    if constexpr (Config::kPersistent)
      mbarrier_init(shared_base + Layout::kTileFullOffset, 1); // the producer's publication of its claims
    mbarrier_init_fence();
    tma_prefetch_descriptor(&params.q_map);
    tma_prefetch_descriptor(&params.k_map);
    tma_prefetch_descriptor(&params.v_map);
    if constexpr (!Config::kPersistent && !Config::kInlineLoads) // its own thread's barrier: no CTA barrier first
      load_q<Config>(params, grid_tile, shared_base, barriers);
    if constexpr (Config::kInlineLoads && Config::kPackedSequences)
      InlineTileBounds<Config>{shared_base + Layout::kTileSlotOffset}.store(
          grid_tile, min(unmasked_block_end<Config>(grid_tile, grid_tile.q_begin), grid_tile.block_end));
  }
  VisitedBlocks<Config> visits{};
  if constexpr (Config::kBlockSparse) { // read before the roles split: the producer and the consumers walk it alike
    static_assert(!Config::kPersistent, "a block-sparse CTA reads one tile's mask row");
    visits.block_end = grid_tile.block_end;
    visits.kept = collect_kept_blocks<Config>(
        params.base, grid_tile,
        reinterpret_cast<unsigned *>(shared_memory + (shared_base - raw_base) + Layout::kKeptOffset));
  }
  __syncthreads();

  if constexpr (Config::kInlineLoads) {
    consume_inline<Config>(params, grid_tile, shared_base, barriers);
  } else { // (not instantiated with inline loads)
    // Broadcast from lane 0 so that the compiler knows the role is warp-uniform: a wgmma under a branch it considers
    // divergent gets serialized (ptxas C7518).
    const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
    if (warpgroup == 0) {
      if constexpr (Config::kProducerRegisters > 0) // one consumer: no hand-over needed
        warpgroup_release_registers<Config::kProducerRegisters>();
      if (threadIdx.x == 0) {
        if constexpr (Config::kPersistent) {
          produce<Config>(params, schedule, shared_base, barriers);
        } else {
          int position = 0;
          if constexpr (!Config::kBlockSparse)
            visits.block_end = grid_tile.block_end;
          produce_tile<Config>(params, grid_tile, visits, shared_base, barriers, position);
        }
      }
    } else {
      if constexpr (Config::kConsumerRegisters > 0)
        warpgroup_claim_registers<Config::kConsumerRegisters>();
      consume_tiles<Config>(params, schedule, grid_tile, visits, shared_base, barriers, warpgroup - 1);
    }
  }
}

} // namespace sage::device::sm90
