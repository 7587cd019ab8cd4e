// The sm90 attention kernel's geometry and state, all derived from the generated Config: what its operands are,
// the shared-memory layout, the registers a consumer thread keeps, and which tile a CTA works on.
#pragma once

#include "sage/device/sequences.cuh"
#include "sage/device/sm90/common.cuh"

namespace sage::device::sm90 {

enum class QkOperands { int8, f16, bf16 };
enum class PvOperands { f16_accumulate_f16, f16_accumulate_f32, int8, e4m3 };
enum class ValueTiles { input, workspace_values, workspace_codes }; // where V_j comes from (KernelPlan ValueSource)

// Block-sparse masks: the KV blocks of a CTA's mask row that shared memory holds as a bitmask (block_sparse.cuh);
// Sm90Schedule.cpp reserves the same bytes.
constexpr int kKeptBlockCapacity = 16384;

// The width of a tile's column chunks: the whole row up to 128 bytes, else 128-byte chunks, or 64-byte ones where
// 128 does not divide the row (int8 Q/K at head_dim 192: three 64-byte chunks with the 64-byte swizzle).
__host__ __device__ constexpr int chunk_bytes_of_rows(int row_bytes) {
  return row_bytes <= 128 ? row_bytes : (row_bytes % 128 == 0 ? 128 : 64);
}

// Shared-memory geometry derived from a Config: every tile is split into column chunks of at most 128 bytes (one
// TMA box and one swizzle atom wide), each chunk a [rows][chunk bytes] block aligned to 1024 bytes.
template <class Config> struct SharedLayout {
  static constexpr int kQkElementBytes = Config::kQk == QkOperands::int8 ? 1 : 2;
  static constexpr int kQkRowBytes = Config::kHeadDim * kQkElementBytes;
  static constexpr int kQkChunkBytes = chunk_bytes_of_rows(kQkRowBytes);
  static constexpr int kQkChunks = kQkRowBytes / kQkChunkBytes;
  static constexpr int kQChunkStride = Config::kBlockQ * kQkChunkBytes;
  static constexpr int kKChunkStride = Config::kBlockKv * kQkChunkBytes;
  static constexpr int kQBytes = kQkChunks * kQChunkStride;
  static constexpr int kKBytes = kQkChunks * kKChunkStride;

  static constexpr bool kTransposedV = Config::kValues == ValueTiles::workspace_codes;
  // V^T codes: rows are channels, kBlockKv one-byte tokens each. f16 V: rows are tokens, 2 * kHeadDim bytes each.
  static constexpr int kVRows = kTransposedV ? Config::kHeadDim : Config::kBlockKv;
  static constexpr int kVRowBytes = kTransposedV ? Config::kBlockKv : 2 * Config::kHeadDim;
  static constexpr int kVChunkBytes = chunk_bytes_of_rows(kVRowBytes);
  static constexpr int kVChunks = kVRowBytes / kVChunkBytes;
  static constexpr int kVChunkStride = kVRows * kVChunkBytes;
  static constexpr int kVBytes = kVChunks * kVChunkStride;

  static __host__ __device__ constexpr int align(int bytes) { return (bytes + 1023) / 1024 * 1024; }
  static constexpr int kQOffset = 0;
  static constexpr int kStageOffset = align(kQBytes);
  static constexpr int kKOffset = 0; // within a stage
  static constexpr int kVOffset = align(kKBytes);
  static constexpr int kStageBytes = align(kVOffset + kVBytes);
  // Block-sparse: the CTA's kept KV blocks, one bit each
  static constexpr int kKeptOffset = kStageOffset + Config::kStages * kStageBytes;
  static constexpr int kKeptBytes = Config::kBlockSparse ? kKeptBlockCapacity / 8 : 0;
  static constexpr int kBarrierOffset = kKeptOffset + kKeptBytes;
  // full_k, full_v, empty_k, empty_v [kStages] each, q_full, q_empty: 8 bytes each (StageBarriers)
  static constexpr int kBarrierBytes = (4 * Config::kStages + 2) * 8;
  static constexpr int kTotalBytes = kBarrierOffset + kBarrierBytes;
  // The dynamic buffer is only guaranteed 16-byte alignment: the kernel rounds its base up to 1024.
  static constexpr int kDynamicBytes = kTotalBytes + 1024;
  // A persistent CTA's claimed tiles (this one, the next: two ints), written by the producer for the consumers, and
  // the mbarrier that publishes them (tile_full). Both lie in the alignment slack: rounding a 16-byte aligned base up
  // to 1024 skips at most 1008 of kDynamicBytes' 1024 spare bytes, so at least 16 remain after kTotalBytes.
  static constexpr int kTileSlotOffset = kTotalBytes;
  static constexpr int kTileFullOffset = kTotalBytes + 8;
};

// The pipeline's mbarriers. K_j and V_j have their own: a stage's K is released as soon as S_j = Q K_j^T has landed,
// a pipeline position earlier than its V (released after O += P~_j V_j), so that with two stages (the block-sparse
// kernels' two CTAs per SM) K_(j+2) is already on its way while the consumers still work on block j.
template <class Config> struct StageBarriers {
  unsigned base; // shared-window address of full_k[0]
  __device__ __forceinline__ unsigned full_k(int position) const { return at(0, position); }
  __device__ __forceinline__ unsigned full_v(int position) const { return at(1, position); }
  __device__ __forceinline__ unsigned empty_k(int position) const { return at(2, position); }
  __device__ __forceinline__ unsigned empty_v(int position) const { return at(3, position); }
  __device__ __forceinline__ unsigned q_full() const { return base + 4 * Config::kStages * 8; }
  // Persistent CTAs: the consumers have read Q_i for the last time (its last S landed), so the next tile's may load.
  __device__ __forceinline__ unsigned q_empty() const { return base + (4 * Config::kStages + 1) * 8; }
  // The parity of position's use of its stage (positions kStages apart alternate).
  __device__ __forceinline__ static unsigned phase(int position) {
    return static_cast<unsigned>((position / Config::kStages) & 1);
  }
  // The parity of a single-slot barrier's use number `use` (q_full, q_empty: one use per tile)
  __device__ __forceinline__ static unsigned phase_of(int use) { return static_cast<unsigned>(use & 1); }

private:
  __device__ __forceinline__ unsigned at(int kind, int position) const {
    return base + (kind * Config::kStages + position % Config::kStages) * 8;
  }
};

template <int kTokensPerGroup, int kInterleave> __device__ __forceinline__ int scale_group(int token) {
  if constexpr (kTokensPerGroup == 0)
    return 0;
  else
    return token / kTokensPerGroup * kInterleave + token % kInterleave;
}

// The column slices of O that one P.V wgmma writes: Config::kPvSliceChannels, the schedule's choice
// (Sm90Schedule.cpp, KernelPlan::pv_mma.n): n = head_dim up to 128 and for an f16 accumulator; beyond, an f32 or s32
// m64 x head_dim accumulator (128 registers a thread at 256) does not fit beside S or an outer sum, so P.V is issued
// as several wgmma over column slices of V (8-bit V^T in slices of any 16 channels, f16 V in whole 64-channel
// swizzle atoms).
template <class Config> struct ValueSlices {
  static constexpr int kChannels = Config::kPvSliceChannels;
  static constexpr int kCount = Config::kHeadDim / kChannels;
  static_assert(kChannels * kCount == Config::kHeadDim && kChannels % 16 == 0, "whole slices of 16 channels");
};

// What one consumer thread keeps across the KV loop: its two rows (g and g + 8 of its warp's 16) and their state.
template <class Config> struct ConsumerState {
  static constexpr int kScoreRegisters = Config::kBlockKv / 2;     // m64 x kBlockKv, per thread
  static constexpr int kOutputF32Registers = Config::kHeadDim / 2; // m64 x kHeadDim f32, per thread
  static constexpr bool kF16Accumulator = Config::kPv == PvOperands::f16_accumulate_f16;
  using OutputRegister = Select<kF16Accumulator, unsigned, float>;

  // The f32 sum beside the P.V accumulator: int8 P.V adds each block's s32 product into it; two-level accumulation
  // adds the accumulator into it every kFlushPeriod blocks. Both are kept relative to the same m (row_max).
  static constexpr bool kOuterSum = Config::kPv == PvOperands::int8 || Config::kTwoLevel;
  // Each block's product is added into the outer sum on its own (int8 P.V, or two-level with a flush every block):
  // the sum's rescaling then rides on that add, flushed = flushed x exp2(m' - m) + product, one FFMA per register.
  static constexpr bool kFoldsRescale =
      Config::kPv == PvOperands::int8 || (Config::kTwoLevel && Config::kFlushPeriod == 1);
  // Several column slices with an outer sum: each slice's product is folded into the sum before the next slice's
  // wgmma, so the block's accumulator holds one slice only (the schedule flushes every block there).
  static constexpr bool kSlicedFold = ValueSlices<Config>::kCount > 1 && kOuterSum;
  static_assert(!kSlicedFold || kFoldsRescale, "sliced P.V with an outer sum: the product is folded every block");
  static constexpr int kOutputChannels = kSlicedFold ? ValueSlices<Config>::kChannels : Config::kHeadDim;
  static constexpr int kOutputRegisters = kF16Accumulator ? kOutputChannels / 4 : kOutputChannels / 2;

  OutputRegister output[kOutputRegisters]; // the P.V accumulator (f16x2 pairs or f32; one slice: kSlicedFold)
  float flushed[kOuterSum ? kOutputF32Registers : 1]; // the outer f32 sum (registers, not shared memory)
  float product_rescale[2]; // kFoldsRescale: exp2(m' - m) for the outer sum when the block in flight is added
  float row_factor[2];      // delta_Q x the factor that puts S in base 2
  float row_max[2];         // m_i
  float row_sum[2];         // this thread's share of l_i (its own columns)
  int blocks_since_flush;   // blocks in `output` since it was restarted (two-level: since its last flush)
};

// Where this CTA works: its Q block, head, batch and the KV blocks it visits. Packed sequences: the batch index is the
// sequence, whose lengths, first rows and causal offset come from SageSequenceOffsets (sage/device/sequences.cuh);
// the workspace keeps the dense [batch, heads, padded tokens] layout, so only the caller's tensors use the bases.
struct TileCoordinates {
  int q_block, head, batch, kv_head;
  int q_begin;
  long long q_head_index, kv_head_index;
  int kv_blocks, block_end; // [0, block_end) of kv_blocks
  int causal_offset;        // key j is visible to row i iff j <= i + causal_offset (SageAttentionParams)
  int tokens_q, tokens_kv;  // the tile's sequence (dense: the call's)
  int q_base, kv_base;      // its first rows in the caller's Q/O/LSE and V (dense: 0)
  // Packed: the tile lies past its sequence's end (it reads and writes nothing)
  __device__ __forceinline__ bool empty() const { return q_begin >= tokens_q; }
};

template <class Config>
__device__ __forceinline__ TileCoordinates tile_coordinates(const SageAttentionParams &params, int q_block, int head,
                                                            int batch) {
  const SageProblemSize &size = params.size;
  const SequenceExtent sequence = sequence_extent<Config::kPackedSequences>(params, batch);
  TileCoordinates tile;
  tile.q_block = q_block;
  tile.head = head;
  tile.batch = batch;
  tile.kv_head = tile.head / (size.heads_q / size.heads_kv);
  tile.q_begin = tile.q_block * Config::kBlockQ;
  tile.q_head_index = static_cast<long long>(tile.batch) * size.heads_q + tile.head;
  tile.kv_head_index = static_cast<long long>(tile.batch) * size.heads_kv + tile.kv_head;
  tile.tokens_q = sequence.tokens_q;
  tile.tokens_kv = sequence.tokens_kv;
  tile.q_base = sequence.q_base;
  tile.kv_base = sequence.kv_base;
  tile.kv_blocks = (tile.tokens_kv + Config::kBlockKv - 1) / Config::kBlockKv;
  tile.causal_offset = sequence.causal_offset; // tokens_kv - tokens_q: bottom-right aligned; 0: top-left
  tile.block_end = tile.kv_blocks;
  if constexpr (Config::kCausal) { // blocks after the diagonal of this Q block's last row are skipped
    const int last_row = min(tile.q_begin + Config::kBlockQ, tile.tokens_q) - 1;
    const int last_visible_token = last_row + tile.causal_offset;
    tile.block_end = last_visible_token < 0 ? 0 : min(tile.kv_blocks, last_visible_token / Config::kBlockKv + 1);
  }
  if constexpr (Config::kPackedSequences) // an empty tile visits nothing (its producer and consumers agree on that)
    if (tile.empty())
      tile.block_end = 0;
  return tile;
}

// The tile's rows for its epilogue: packed, its sequence's length and first row read again from the offsets rather
// than kept in registers through the KV loop (the inline-loads kernel has none to spare); dense, the tile's.
template <class Config>
__device__ __forceinline__ TileCoordinates epilogue_tile(const SageAttentionParams &params,
                                                         const TileCoordinates &tile) {
  TileCoordinates rows = tile;
  if constexpr (Config::kPackedSequences) {
    const SequenceExtent sequence = sequence_extent<true>(params, tile.batch);
    rows.tokens_q = sequence.tokens_q;
    rows.q_base = sequence.q_base;
  }
  return rows;
}

// The tiles (Q block, q head, batch) a CTA works on. One CTA per tile: the grid is (Q blocks, heads, batch). A
// persistent CTA claims its tiles one at a time from a counter in global memory (`claim`), in an order that keeps
// the Q blocks of one head together (their CTAs share K and V in L2) or, causal, puts the longest rows first across
// all heads. Claimed, not dealt round-robin: a CTA that starts late, or an SM that another kernel holds (NCCL's
// transfers during ring attention), delays only the tiles it has claimed, not a fixed share of the grid (H200: a
// 2 ms hold of 4 SMs added 1.8 ms to sage-b's 10.6 ms call with the round-robin, run 36).
template <class Config> struct TileSchedule {
  int q_blocks, tiles;

  __device__ __forceinline__ explicit TileSchedule(const SageProblemSize &size)
      : q_blocks((size.tokens_q + Config::kBlockQ - 1) / Config::kBlockQ),
        tiles(Config::kPersistent ? q_blocks * size.heads_q * size.batch : 1) {}
  // The next unclaimed tile (>= tiles: none left). The counter is zero when the launch starts (the runtime clears
  // WorkspaceLayout::attention_counters before each launch of a persistent kernel).
  // Packed sequences: the tiles past their sequence's end are claimed and passed over here, so that the consumers
  // never see one.
  __device__ __forceinline__ int claim(unsigned *counter, const SageAttentionParams &params) const {
    int tile = static_cast<int>(atomicAdd(counter, 1u));
    if constexpr (Config::kPackedSequences)
      while (tile < tiles && coordinates(tile, params).empty())
        tile = static_cast<int>(atomicAdd(counter, 1u));
    return tile;
  }
  __device__ __forceinline__ TileCoordinates coordinates(int tile, const SageAttentionParams &params) const {
    const SageProblemSize &size = params.size;
    int q_block, head, batch;
    if constexpr (!Config::kPersistent) {
      q_block = Config::kReverseQBlocks ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
      head = static_cast<int>(blockIdx.y);
      batch = static_cast<int>(blockIdx.z);
    } else if constexpr (Config::kReverseQBlocks) {
      const int heads = size.heads_q * size.batch;
      q_block = q_blocks - 1 - tile / heads;
      head = tile % heads % size.heads_q;
      batch = tile % heads / size.heads_q;
    } else {
      q_block = tile % q_blocks;
      head = tile / q_blocks % size.heads_q;
      batch = tile / q_blocks / size.heads_q;
    }
    return tile_coordinates<Config>(params, q_block, head, batch);
  }
};

} // namespace sage::device::sm90
