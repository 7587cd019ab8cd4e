// The one-pass quantization prologue's work order and its waits (PrologueGenerator.h, "One pass"). Every CTA draws
// a ticket; the tickets order the work head by head: the column statistics of KV head h + kOnePassLookaheadHeads,
// a share of the roles that wait for nothing (psi_Q's blocks, ...), then the K and V tiles of head h, which wait
// until head h's statistics CTAs have published. A tile waits only for CTAs with earlier tickets, which were already
// running when it drew its own and never wait themselves, so the launch cannot deadlock whatever the GPU keeps
// resident. The tiles read K and V again, from L2 where the statistics just read them, and the statistics that the
// head's last statistics CTA combined once.
//
// The generator pastes this header after its constants (kOnePassKStatistics, kOnePassVStatistics,
// kOnePassLookaheadHeads, kBlockKv, kKBlocksPerTile) and geometry.cuh, whose names it uses. The counters
// (prologue_counters: the ticket, then one word per KV head) are zero when the launch starts.
#pragma once

namespace sage::device::prologue {

enum class OnePassWork : int { k_statistics, v_statistics, k_tile, v_tile, independent };

struct OnePassItem {
  OnePassWork work;
  long long cta;  // the role function's CTA index (head-major within the role)
  long long head; // batch index * heads_kv + KV head index (statistics and tiles)
};

__device__ __forceinline__ unsigned *onePassCounters(const SagePrologueParams &params) {
  return (unsigned *)(params.workspace + params.counters_offset);
}

// Statistics CTAs of one KV head (K's slices, then V's), and the tiles that wait for them (K's, then V's).
__device__ __forceinline__ int onePassKSlices(const SageProblemSize &size) {
  return kOnePassKStatistics ? statisticsSlices(size) : 0;
}
__device__ __forceinline__ int onePassVSlices(const SageProblemSize &size) {
  return kOnePassVStatistics ? statisticsSlices(size) : 0;
}
__device__ __forceinline__ int onePassKTiles(const SageProblemSize &size) {
  return kOnePassKStatistics ? (int)ceilDiv(size.padded_kv / kBlockKv, kKBlocksPerTile) : 0;
}
__device__ __forceinline__ int onePassVTiles(const SageProblemSize &size) {
  return kOnePassVStatistics ? vTiles(size) : 0;
}

// Item `index` of head `head`'s statistics (index < its slices) or of its tiles.
__device__ __forceinline__ OnePassItem onePassStatisticsItem(const SageProblemSize &size, long long head, int index) {
  const int k_slices = onePassKSlices(size);
  if (index < k_slices)
    return {OnePassWork::k_statistics, head * k_slices + index, head};
  return {OnePassWork::v_statistics, head * onePassVSlices(size) + (index - k_slices), head};
}
__device__ __forceinline__ OnePassItem onePassTileItem(const SageProblemSize &size, long long head, int index) {
  const int k_tiles = onePassKTiles(size);
  if (index < k_tiles)
    return {OnePassWork::k_tile, head * k_tiles + index, head};
  return {OnePassWork::v_tile, head * onePassVTiles(size) + (index - k_tiles), head};
}

// The first ticket of segment `segment` (0 <= segment <= heads): the statistics of heads [0, L) come first; segment h
// holds the statistics of head h + L (while there is one), its share of the independent items, and the tiles of head
// h. Spreading the independent items (psi_Q's blocks, ...) over the segments keeps HBM busy while tiles wait and puts
// more time between a head's statistics and its tiles.
__device__ __forceinline__ long long onePassSegmentStart(long long segment, long long heads, long long lookahead,
                                                         long long statistics, long long tiles, long long independent) {
  const long long with_statistics = segment < heads - lookahead ? segment : heads - lookahead;
  return lookahead * statistics + with_statistics * statistics + segment * independent / heads + segment * tiles;
}

// The work of ticket `ticket` (`cta` of an independent item counts from 0 over those roles, in their order).
__device__ __forceinline__ OnePassItem onePassItem(const SageProblemSize &size, long long ticket,
                                                   long long independent) {
  const long long heads = kvHeads(size);
  const long long statistics = onePassKSlices(size) + onePassVSlices(size); // per head
  const long long tiles = onePassKTiles(size) + onePassVTiles(size);
  const long long lookahead = heads < kOnePassLookaheadHeads ? heads : kOnePassLookaheadHeads;
  if (ticket < lookahead * statistics)
    return onePassStatisticsItem(size, ticket / statistics, (int)(ticket % statistics));
  // The segment: the last whose first ticket is <= ticket.
  long long low = 0, high = heads - 1;
  while (low < high) {
    const long long middle = (low + high + 1) / 2;
    if (onePassSegmentStart(middle, heads, lookahead, statistics, tiles, independent) <= ticket)
      low = middle;
    else
      high = middle - 1;
  }
  const long long segment = low;
  long long offset = ticket - onePassSegmentStart(segment, heads, lookahead, statistics, tiles, independent);
  if (segment + lookahead < heads) {
    if (offset < statistics)
      return onePassStatisticsItem(size, segment + lookahead, (int)offset);
    offset -= statistics;
  }
  const long long first_independent = segment * independent / heads;
  const long long shared = (segment + 1) * independent / heads - first_independent;
  if (offset < shared)
    return {OnePassWork::independent, first_independent + offset, -1};
  return onePassTileItem(size, segment, (int)(offset - shared));
}

// The CTA's ticket, in drawing order (one atomic per CTA), and its work: thread 0 finds it (a search over the
// segments, with 64-bit divisions: a few hundred instructions that every warp would otherwise repeat) and hands it
// to the CTA through shared memory.
__device__ __forceinline__ OnePassItem drawOnePassItem(const SagePrologueParams &params, long long independent) {
  __shared__ OnePassItem item;
  if (threadIdx.x == 0)
    item = onePassItem(params.size, atomicAdd(onePassCounters(params), 1u), independent);
  __syncthreads();
  return item;
}

// After a statistics CTA has written its slice: every thread's stores are made visible to the GPU before the
// head's count goes up (the fence of each writer, then one release by thread 0 after the barrier). The CTA whose
// slice completes the head's count then combines the head's slices once (Roles::combine: in slice order, as every
// tile of the two launches does, so the bytes are theirs) and raises the count once more, to "combined".
template <class Roles>
__device__ __forceinline__ void publishStatistics(const SagePrologueParams &params, long long head,
                                                  unsigned char *shared) {
  const unsigned slices = (unsigned)(onePassKSlices(params.size) + onePassVSlices(params.size));
  unsigned *count = onePassCounters(params) + 1 + head;
  __shared__ unsigned last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(count, 1u) == slices - 1 ? 1u : 0u;
  __syncthreads();
  if (!last)
    return;
  __threadfence(); // the other slices, published before the count this CTA saw, are read after it
  Roles::combine(params, head, shared);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    atomicAdd(count, 1u);
}

// Before a tile reads its head's statistics: until the head's last statistics CTA has combined them. They are then
// read through L2 (ld.global.cg), never a stale L1 line.
__device__ __forceinline__ void awaitStatistics(const SagePrologueParams &params, long long head) {
  if (threadIdx.x == 0) {
    const unsigned combined = (unsigned)(onePassKSlices(params.size) + onePassVSlices(params.size)) + 1u;
    const unsigned *count = onePassCounters(params) + 1 + head;
    unsigned seen;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      if (seen >= combined)
        break;
      __nanosleep(100);
    }
  }
  __syncthreads();
}

// One CTA of the one-pass launch: its ticket, then its work. Roles (generated: the variant's role functions) has
// static kStatistics, vStatistics, kTile, vTile (those the variant has: kOnePassKStatistics, kOnePassVStatistics),
// independent (the roles that wait for nothing, by CTA range) and independentCtas (their CTA count), each taking
// (params, cta, shared), and combine (params, head, shared). Statistics publish when done; the tiles wait in their
// combine (awaitStatistics).
template <class Roles>
__device__ __forceinline__ void runOnePassCta(const SagePrologueParams &params, unsigned char *shared) {
  const OnePassItem item = drawOnePassItem(params, Roles::independentCtas(params));
  switch (item.work) {
  case OnePassWork::k_statistics:
    if constexpr (kOnePassKStatistics) {
      Roles::kStatistics(params, item.cta, shared);
      publishStatistics<Roles>(params, item.head, shared);
    }
    return;
  case OnePassWork::v_statistics:
    if constexpr (kOnePassVStatistics) {
      Roles::vStatistics(params, item.cta, shared);
      publishStatistics<Roles>(params, item.head, shared);
    }
    return;
  case OnePassWork::k_tile:
    if constexpr (kOnePassKStatistics)
      Roles::kTile(params, item.cta, shared);
    return;
  case OnePassWork::v_tile:
    if constexpr (kOnePassVStatistics)
      Roles::vTile(params, item.cta, shared);
    return;
  default:
    return Roles::independent(params, item.cta, shared);
  }
}

} // namespace sage::device::prologue
