// The sm80 attention kernel (schedule sm80.mma_sync: sm_80, sm_86, sm_89, and the fallback of newer archs):
// Algorithm 1 of SageAttention with FlashAttention-2 tiling on mma.sync. One CTA per (Q block i, q head, batch); for
// each KV block j, K_j and V_j stream through shared memory (cp.async, kStages stages), and each warp computes for
// its kRowsPerWarp rows of Q_i:
//   S_i^j = psi^-1(Q_i K_j^T)                       mma.sync, Q_i's fragments kept in registers (score_steps.cuh)
//   m_i^j, P~_i^j = exp2(S_i^j - m_i^j), l_i^j      online softmax in base 2 (softmax.cuh)
//   O_i^j = diag(exp2(m_i^(j-1) - m_i^j)) O_i^(j-1) + P~_i^j V_j   (value_steps_*.cuh, fp4_steps.cuh, two_level.cuh)
// and finally O_i = diag(l_i)^-1 O_i and the LSE (epilogue.cuh).
//
// The generator instantiates attention_kernel<Config> with a Config struct of constants (see the generated source:
// the plan's tunables and shared-memory offsets, and what the variant decides); every variant decision is a constant
// there and an `if constexpr` here, so the compiler removes the unused paths. SageAttentionParams (the kernel ABI,
// sage/codegen/KernelAbi.h) is declared before this header.
#pragma once

#include "sage/device/conversions.cuh"
#include "sage/device/lanes.cuh"
#include "sage/device/sequences.cuh"
#include "sage/device/sm80/epilogue.cuh"
#include "sage/device/sm80/fp4_steps.cuh"
#include "sage/device/sm80/geometry.cuh"
#include "sage/device/sm80/instructions.cuh"
#include "sage/device/sm80/score_steps.cuh"
#include "sage/device/sm80/softmax.cuh"
#include "sage/device/sm80/tile_helpers.cuh"
#include "sage/device/sm80/two_level.cuh"
#include "sage/device/sm80/value_steps_codes.cuh"
#include "sage/device/sm80/value_steps_f16.cuh"

namespace sage::device::sm80 {

constexpr float kLog2e = 1.44269504088896341f;

// The CTA's dynamic shared memory: Q_i, then the pipeline stages (the Config's offsets)
extern __shared__ __align__(128) unsigned char shared_memory[];

// ---- The workspace buffers (sage/schedules/WorkspaceLayout.h) the kernel reads for a Config, and its Q/K rows ----
// The kernel reads params.offsets.X exactly when X is true here (tests/prologue/WorkspaceContractTest.cpp checks
// that the layout reserves each of them and the prologue writes it).
template <class Config> struct WorkspaceReads {
  static constexpr bool kFp4 = Geometry<Config>::kFp4, kCodes = Geometry<Config>::kCodes;
  static constexpr bool q_codes = true; // Q's codes, or its 16-bit copy (unquantized Q)
  static constexpr bool k_codes = true;
  static constexpr bool q_scales = Config::kQuantizedQk || kFp4; // f32 per scale group, or FP4 microscales
  static constexpr bool k_scales = Config::kQuantizedQk || kFp4;
  static constexpr bool q_mean = false; // Q smoothing reaches the kernel as delta_s
  static constexpr bool k_mean = Config::kWriteLse && Config::kLseCorrection;
  static constexpr bool v_values = !kFp4 && Config::kValues == ValueSource::workspace_values;
  static constexpr bool v_codes = kFp4 || Config::kValues == ValueSource::workspace_codes;
  static constexpr bool v_scales = kCodes || kFp4; // per-channel delta_V, or FP4 microscales
  static constexpr bool v_mean = Config::kSmoothedV;
  static constexpr bool delta_s = Config::kSmoothedQ;
  // Bytes between two tokens' rows of Q's and K's codes (or 16-bit values) in the workspace
  static constexpr int kQRowBytes = kFp4 ? Config::kQCodeRowBytes : Geometry<Config>::kQkRowBytes;
  static constexpr int kKRowBytes = kFp4 ? Config::kKCodeRowBytes : Geometry<Config>::kQkRowBytes;
};

// ---- The registers one thread keeps across the KV loop ----
template <class Config> struct ThreadState {
  using G = Geometry<Config>;
  unsigned q_fragment[G::kQFragmentTiles][G::kQFragmentSteps][4]; // Q_i as A fragments of the Q.K^T mma
  unsigned q_lane_offset;                                         // this lane's ldmatrix offset in Q_i's tile
  float q_row_scale[G::kRowTiles][2]; // delta_Q of rows g and g + 8 (1 when Q is not quantized)
  float row_factor[G::kRowTiles][2];  // delta_Q x the factor that puts S in base 2
  float row_max[G::kRowTiles][2];     // m_i
  float row_sum[G::kRowTiles][2];     // this thread's share of l_i (its own columns)
  // O_i: f16x2 words (rows g, g + 8 x channels 2t, 2t + 1) or f32 values
  typename G::OutputAccumulator o_accumulator[G::kRowTiles][G::kOutputTiles][G::kOutputRegisters];
  float o_flushed[G::kRowTiles][G::kOutputTiles][4]; // two-level: the sum of the flushed accumulators
  int blocks_since_flush;                            // two-level
};

// ---- This thread's place in the CTA's tile ----
struct ThreadPosition {
  unsigned shared_base; // shared-memory address of the dynamic buffer
  int warp, lane;
  int quad_lane;     // PTX threadID_in_group: columns 2t, 2t + 1 of each n8 tile
  int first_row;     // sequence row of this thread's row g in row tile 0
  int causal_offset; // key j is visible to row i iff j <= i + causal_offset (packed: the sequence's)
};

// ---- Where this CTA's K_j and V_j come from, and which KV blocks it visits ----
template <class Config> struct KvStream {
  using G = Geometry<Config>;
  // K's scales: f32 per scale group (quantized Q/K), or FP4 microscales (one byte per group)
  using KScale = typename SelectType<G::kFp4, unsigned char, float>::type;
  const unsigned char *k_codes;  // [padded_kv, d] of this KV head
  const float *delta_s;          // Q smoothing: the prologue's delta_s of this CTA's Q block [padded_kv]
  float delta_factor;            // Q smoothing: puts delta_s in S's domain
  const KScale *k_scales;        // K's scales of this KV head (FP4: microscales [padded_kv, d / group])
  const unsigned char *v_codes;  // V^T codes [d, padded_kv] of this KV head (FP4: e2m1 [d, padded_kv / 2])
  const unsigned char *v_scales; // FP4: V^T's microscales [d, padded_kv / group] of this KV head
  const unsigned char *v_rows;   // f16 V [tokens, d] of this KV head
  long long v_row_stride;        // bytes between V's rows
  int tokens_kv, padded_kv;
  int block_end;                    // one past the last KV block visited
  const unsigned char *kept_blocks; // block-sparse: block_mask[b, h, i, :] (1 = visit), or null

  // The next KV block visited after `block` (-1: the first one)
  __device__ __forceinline__ int next_block(int block) const {
    if constexpr (!Config::kBlockSparse) {
      return block + 1;
    } else {
      ++block;
      while (kept_blocks && block < block_end && kept_blocks[block] == 0)
        ++block;
      return block;
    }
  }

  // K_j, V_j (and K_j's staged scales) of KV block `kv_block` into the pipeline stage at `stage_base`, with cp.async
  __device__ __forceinline__ void load(unsigned stage_base, int kv_block) const {
    constexpr int kThreads = G::kThreads, kBlockKv = Config::kBlockKv;
    const int kv_begin = kv_block * kBlockKv;
    if constexpr (G::kFp4) {
      copy_tile_async<kThreads, kBlockKv, Config::kKCodeRowBytes, false>(
          stage_base + Config::kKCodesOffset, k_codes + static_cast<long long>(kv_begin) * Config::kKCodeRowBytes,
          Config::kKCodeRowBytes, kBlockKv);
      // K_j's scales are contiguous: copied as 16-byte rows
      constexpr int kScaleChunks = kBlockKv * Config::kKScaleRowBytes / kChunkBytes;
      copy_tile_async<kThreads, kScaleChunks, kChunkBytes, false>(
          stage_base + Config::kKScalesOffset, k_scales + static_cast<long long>(kv_begin) * Config::kKScaleRowBytes,
          kChunkBytes, kScaleChunks);
      // V_j^T's scales are read from the workspace by the decode (rows of b_kv / group bytes)
      copy_tile_async<kThreads, Config::kHeadDim, Config::kVCodeRowBytes, false>(
          stage_base + Config::kVCodesOffset, v_codes + kv_begin / 2, padded_kv / 2, Config::kHeadDim);
    } else {
      copy_tile_async<kThreads, kBlockKv, Config::kKRowBytes, false, G::kQkRowBytes>(
          stage_base + Config::kKTileOffset, k_codes + static_cast<long long>(kv_begin) * G::kQkRowBytes,
          G::kQkRowBytes, kBlockKv);
      if constexpr (Config::kValues == ValueSource::workspace_codes)
        copy_tile_async<kThreads, Config::kVRows, Config::kVRowBytes, false>(
            stage_base + Config::kVTileOffset, v_codes + kv_begin, padded_kv, Config::kVRows);
      else // past the end: 0
        copy_tile_async<kThreads, Config::kVRows, Config::kVRowBytes, true, G::kVValueRowBytes>(
            stage_base + Config::kVTileOffset, v_rows + kv_begin * v_row_stride, v_row_stride, tokens_kv - kv_begin);
      if constexpr (Config::kStagedKScales) {
        const float *block_scales =
            k_scales + scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(kv_begin);
        for (int slot = threadIdx.x; slot < Config::kKScalesPerBlock; slot += kThreads)
          cp_async_4(stage_base + Config::kKScalesOffset + slot * static_cast<int>(sizeof(float)), block_scales + slot);
      }
    }
  }
};

// The steps of O_i^j += P~_i^j V_j of an f16 or 8-bit-code P.V path (FP4 by emulation: Fp4Steps<Config>)
template <class Config>
using ValueSteps = typename SelectType<Geometry<Config>::kCodes, CodeValueSteps<Config>, F16ValueSteps<Config>>::type;

// ---- One step of the main loop: KV block j, in pipeline stage (iteration % kStages) ----
// kMasked: only blocks that cross the end of the sequence (or the causal diagonal) run the mask code.
template <class Config, bool kMasked>
__device__ __forceinline__ void process_kv_block(ThreadState<Config> &state, const ThreadPosition &position,
                                                 const KvStream<Config> &kv, int &load_block, int kv_block,
                                                 int iteration) {
  using G = Geometry<Config>;
  using Scores = ScoreSteps<Config>;
  using Softmax = SoftmaxSteps<Config>;
  constexpr int kStages = Config::kStages, kStageBytes = Config::kStageBytes;
  // The stage holds K_j, V_j once at most kStages - 2 younger groups are pending; the barrier also tells every
  // warp that the stage read in the previous iteration may be refilled.
  cp_async_wait<kStages - 2>();
  __syncthreads();
  if (load_block < kv.block_end) {
    kv.load(position.shared_base + Config::kStageOffset + ((iteration + kStages - 1) % kStages) * kStageBytes,
            load_block);
    load_block = kv.next_block(load_block);
  }
  cp_async_commit();
  const unsigned stage_base = position.shared_base + Config::kStageOffset + (iteration % kStages) * kStageBytes;
  const int kv_begin = kv_block * Config::kBlockKv;
  float k_block_scale = 1.0f; // one K scale for the whole block (quantized Q/K, scales not staged)
  if constexpr (Config::kQuantizedQk && !Config::kStagedKScales)
    k_block_scale = kv.k_scales[scale_group<Config::kKScaleTokensPerGroup, Config::kKScaleInterleave>(kv_begin)];
  unsigned k_tile = stage_base + Config::kKTileOffset;
  if constexpr (G::kFp4) {
    // K_j and V_j^T: e2m1 codes x microscales decoded to 16-bit tiles (exact); the barrier at the top of this
    // step has seen every warp finish reading the previous tiles
    Fp4Steps<Config>::template decode_fp4_tile<Config::kBlockKv, Config::kHeadDim>(
        position.shared_base + Config::kKDecodedOffset, stage_base + Config::kKCodesOffset,
        shared_memory + (stage_base - position.shared_base) + Config::kKScalesOffset, Config::kKScaleRowBytes);
    Fp4Steps<Config>::template decode_fp4_tile<Config::kHeadDim, Config::kBlockKv>(
        position.shared_base + Config::kVDecodedOffset, stage_base + Config::kVCodesOffset,
        kv.v_scales + kv_begin / Config::kFp4Group, kv.padded_kv / Config::kFp4Group);
    __syncthreads();
    k_tile = position.shared_base + Config::kKDecodedOffset;
  }

  // S_i^j = Q_i K_j^T, then psi^-1 into f32 (base-2 domain)
  typename G::ScoreAccumulator score_accumulator[G::kRowTiles][G::kScoreTiles][4];
  Scores::multiply_q_k(score_accumulator, state.q_fragment, position.shared_base + Config::kQTileOffset,
                       state.q_lane_offset, k_tile, position.lane);
  float scores[G::kRowTiles][G::kScoreTiles][4];
  if constexpr (!Config::kQuantizedQk)
    Scores::dequantize_scores(scores, score_accumulator, state.row_factor);
  else if constexpr (Config::kStagedKScales)
    Scores::dequantize_scores(
        scores, score_accumulator, state.row_factor,
        reinterpret_cast<const float *>(shared_memory + (stage_base - position.shared_base) + Config::kKScalesOffset),
        kv_begin, position.quad_lane);
  else
    Scores::dequantize_scores(scores, score_accumulator, state.row_factor, k_block_scale);
  if constexpr (Config::kSmoothedQ)
    Scores::add_q_mean_correction(scores, kv.delta_s + kv_begin, kv.delta_factor, position.quad_lane);
  if (kMasked)
    Scores::mask_scores(scores, position.first_row, kv_begin, kv.tokens_kv, position.causal_offset, position.quad_lane);

  // m_i^j, P~_i^j (in place of S), l_i^j
  float rescale[G::kRowTiles][2];
  Softmax::online_softmax(scores, state.row_max, state.row_sum, rescale);

  // O_i^j = diag(exp2(m_i^(j-1) - m_i^j)) O_i^(j-1) + P~_i^j V_j
  Softmax::rescale_output(state.o_accumulator, rescale);
  if constexpr (Config::kTwoLevel)
    Softmax::rescale_output(state.o_flushed, rescale);
  unsigned p_fragment[G::kRowTiles][G::kPvSteps][4];
  if constexpr (G::kFp4) {
    float p_row_scale[G::kRowTiles][2]; // s_P1 (two-level P), else 1
    Fp4Steps<Config>::quantize_probabilities(p_fragment, p_row_scale, scores);
    Fp4Steps<Config>::multiply_p_v(state.o_accumulator, p_fragment, p_row_scale,
                                   position.shared_base + Config::kVDecodedOffset, position.lane);
  } else {
    ValueSteps<Config>::pack_probabilities(p_fragment, scores);
    ValueSteps<Config>::multiply_p_v(state.o_accumulator, p_fragment, stage_base + Config::kVTileOffset, position.lane);
  }
  if constexpr (Config::kTwoLevel) {
    if (++state.blocks_since_flush == Config::kFlushPeriod) { // two-level accumulation
      flush_accumulator<Config>(state.o_flushed, state.o_accumulator);
      state.blocks_since_flush = 0;
    }
  }
}

// The factor that puts S in the exponent's base-2 domain: 1/sqrt(d) x log2(e) from the parameters, or the Config's
// constant (1 when the prologue folded 1/sqrt(d) log2(e) into Q, log2(e) when it folded 1/sqrt(d))
template <class Config> __device__ __forceinline__ float score_domain_factor(const SageAttentionParams &params) {
  if constexpr (Config::kDomainFactorFromParams)
    return params.softmax_scale * kLog2e;
  else
    return Config::kDomainFactor;
}

template <class Config> __device__ __forceinline__ void attention_kernel(const SageAttentionParams &params) {
  using G = Geometry<Config>;
  using Epilogue = EpilogueSteps<Config>;
  constexpr int kRowTiles = G::kRowTiles, kOutputTiles = G::kOutputTiles;
  constexpr int kBlockQ = Config::kBlockQ, kBlockKv = Config::kBlockKv, kHeadDim = Config::kHeadDim;
  constexpr int kStages = Config::kStages;
  const SageProblemSize size = params.size;
  ThreadPosition position;
  position.shared_base = static_cast<unsigned>(__cvta_generic_to_shared(shared_memory));
  position.warp = static_cast<int>(threadIdx.x) / kWarpSize;
  position.lane = static_cast<int>(threadIdx.x) % kWarpSize;
  position.quad_lane = position.lane % kLanesPerRow;

  // ---- This CTA's Q block i, head and batch; GQA: heads_q / heads_kv q heads share one KV head ----
  const int q_block =
      Config::kReverseQBlocks ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (size.heads_q / size.heads_kv);
  const int q_begin = q_block * kBlockQ;
  // The batch's sequence: its lengths, first rows in the caller's tensors and causal offset (dense: the call's, 0).
  // The workspace keeps the dense layout; only the caller's O, LSE, Q and V use the bases.
  static_assert(!(Config::kPackedSequences && Config::kBlockSparse), "packed sequences: no block-sparse mask rows");
  const SequenceExtent sequence = sequence_extent<Config::kPackedSequences>(params, batch);
  if constexpr (Config::kPackedSequences)
    if (q_begin >= sequence.tokens_q) // past the sequence's end: nothing to read or write
      return;
  position.causal_offset = sequence.causal_offset;
  position.first_row = q_begin + position.warp * G::kRowsPerWarp + position.lane / kLanesPerRow;
  const long long q_head_index = static_cast<long long>(batch) * size.heads_q + head;
  const long long kv_head_index = static_cast<long long>(batch) * size.heads_kv + kv_head;

  // ---- Workspace views of this (batch, head), in the layout of sage/schedules/WorkspaceLayout.h ----
  const unsigned char *workspace = params.workspace;
  using Reads = WorkspaceReads<Config>;
  const unsigned char *q_codes =
      workspace + params.offsets.q_codes + (q_head_index * size.padded_q + q_begin) * Reads::kQRowBytes;
  const unsigned char *q_microscales = nullptr; // FP4: Q_i's microscales
  if constexpr (G::kFp4 && Reads::q_scales)
    q_microscales =
        workspace + params.offsets.q_scales + q_head_index * size.q_scale_count + q_begin * Config::kQScaleRowBytes;
  KvStream<Config> kv;
  kv.k_codes = workspace + params.offsets.k_codes + kv_head_index * size.padded_kv * Reads::kKRowBytes;
  if constexpr (Reads::delta_s) {
    // Q smoothing: delta_s [b, h_q, padded_q / rows, padded_kv], per Q block of the variant (kDeltaSRows rows)
    kv.delta_s =
        reinterpret_cast<const float *>(workspace + params.offsets.delta_s) +
        (q_head_index * (size.padded_q / Config::kDeltaSRows) + q_begin / Config::kDeltaSRows) * size.padded_kv;
    kv.delta_factor = score_domain_factor<Config>(params);
  }
  if constexpr (G::kFp4) {
    // FP4: K's scales, V^T's codes and scales, as the prologue wrote them (codegen/README.md, FP4 operands)
    kv.k_scales = workspace + params.offsets.k_scales + kv_head_index * size.k_scale_count;
    kv.v_codes = workspace + params.offsets.v_codes + kv_head_index * kHeadDim * (size.padded_kv / 2);
    kv.v_scales = workspace + params.offsets.v_scales + kv_head_index * kHeadDim * (size.padded_kv / Config::kFp4Group);
  } else {
    if constexpr (Reads::k_scales)
      kv.k_scales =
          reinterpret_cast<const float *>(workspace + params.offsets.k_scales) + kv_head_index * size.k_scale_count;
    if constexpr (Config::kValues == ValueSource::input) {
      // V: the caller's f16 tensor, read in place (rows may be strided: HND or NHD)
      constexpr int kValueBytes = 2;
      kv.v_row_stride = params.v_strides.token * kValueBytes;
      kv.v_rows = static_cast<const unsigned char *>(params.v) +
                  (batch * params.v_strides.batch + kv_head * params.v_strides.head +
                   sequence.kv_base * params.v_strides.token) *
                      kValueBytes;
    } else if constexpr (Reads::v_values) {
      // V: the prologue's f16 copy (converted from bf16 and/or smoothed)
      kv.v_row_stride = G::kVValueRowBytes;
      kv.v_rows = workspace + params.offsets.v_values + kv_head_index * size.padded_kv * G::kVValueRowBytes;
    } else {
      kv.v_codes = workspace + params.offsets.v_codes + kv_head_index * kHeadDim * size.padded_kv;
    }
  }
  kv.tokens_kv = sequence.tokens_kv; // V read in place: rows from here on are zero-filled, never read
  kv.padded_kv = size.padded_kv;
  const int sequence_kv_blocks = (sequence.tokens_kv + kBlockKv - 1) / kBlockKv;
  if constexpr (Config::kCausal) {
    // Causal: blocks after the diagonal of this Q block's last row are skipped
    const int last_visible_token = min(q_begin + kBlockQ, sequence.tokens_q) - 1 + position.causal_offset;
    kv.block_end = last_visible_token < 0 ? 0 : min(sequence_kv_blocks, last_visible_token / kBlockKv + 1);
  } else {
    kv.block_end = sequence_kv_blocks;
  }
  if constexpr (Config::kBlockSparse) {
    // Block-sparse: KV blocks whose block_mask[b, h, i, j] is 0 are skipped (no mask: every block)
    const int q_blocks = (size.tokens_q + kBlockQ - 1) / kBlockQ;
    const int kv_blocks = (size.tokens_kv + kBlockKv - 1) / kBlockKv;
    kv.kept_blocks = params.block_mask ? params.block_mask + (q_head_index * q_blocks + q_block) * kv_blocks : nullptr;
  }

  // ---- Step 1: Q_i -> shared memory (its own cp.async group), the first kStages - 1 K/V tiles behind it ----
  if constexpr (G::kFp4) {
    copy_tile_async<G::kThreads, kBlockQ, Config::kQCodeRowBytes, false>(position.shared_base + Config::kQCodesOffset,
                                                                         q_codes, Config::kQCodeRowBytes, kBlockQ);
    constexpr int kScaleChunks = kBlockQ * Config::kQScaleRowBytes / kChunkBytes;
    copy_tile_async<G::kThreads, kScaleChunks, kChunkBytes, false>(position.shared_base + Config::kQScalesOffset,
                                                                   q_microscales, kChunkBytes, kScaleChunks);
  } else {
    copy_tile_async<G::kThreads, kBlockQ, Config::kQRowBytes, false, G::kQkRowBytes>(
        position.shared_base + Config::kQTileOffset, q_codes, G::kQkRowBytes, kBlockQ);
  }
  cp_async_commit();
  int load_block = kv.next_block(-1);
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (load_block < kv.block_end) {
      kv.load(position.shared_base + Config::kStageOffset + stage * Config::kStageBytes, load_block);
      load_block = kv.next_block(load_block);
    }
    cp_async_commit(); // possibly empty: keeps one group per stage
  }
  cp_async_wait<kStages - 1>(); // Q_i has landed; K/V may still be in flight
  __syncthreads();
  if constexpr (G::kFp4) {
    // FP4: Q_i's codes x microscales decoded once into the Q tile; its staging bytes are K_j's decoded tile next
    Fp4Steps<Config>::template decode_fp4_tile<kBlockQ, kHeadDim>(
        position.shared_base + Config::kQTileOffset, position.shared_base + Config::kQCodesOffset,
        shared_memory + Config::kQScalesOffset, Config::kQScaleRowBytes);
    __syncthreads();
  }
  ThreadState<Config> state;
  state.q_lane_offset = ScoreSteps<Config>::q_lane_offset(position.warp, position.lane);
  ScoreSteps<Config>::load_q_fragments(state.q_fragment, position.shared_base + Config::kQTileOffset,
                                       state.q_lane_offset);

  // The factor that puts S in the exponent's base-2 domain
  const float domain_factor = score_domain_factor<Config>(params);
  if constexpr (Config::kQuantizedQk) {
    const float *q_scales =
        reinterpret_cast<const float *>(workspace + params.offsets.q_scales) + q_head_index * size.q_scale_count;
    ScoreSteps<Config>::load_q_row_scales(state.q_row_scale, q_scales, position.first_row);
  } else {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
      state.q_row_scale[row_tile][0] = state.q_row_scale[row_tile][1] = 1.0f; // unquantized Q
  }
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      state.row_factor[row_tile][half] = state.q_row_scale[row_tile][half] * domain_factor;
      state.row_max[row_tile][half] = negative_infinity();
      state.row_sum[row_tile][half] = 0.0f;
    }
  if constexpr (G::kF16Accumulator) {
#pragma unroll
    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
      for (int tile = 0; tile < kOutputTiles; ++tile)
        state.o_accumulator[row_tile][tile][0] = state.o_accumulator[row_tile][tile][1] = 0u;
  } else {
    for_each_fragment<kRowTiles, kOutputTiles>(
        [&](int row_tile, int tile, int i) { state.o_accumulator[row_tile][tile][i] = 0.0f; });
  }
  if constexpr (Config::kTwoLevel) {
    for_each_fragment<kRowTiles, kOutputTiles>(
        [&](int row_tile, int tile, int i) { state.o_flushed[row_tile][tile][i] = 0.0f; });
    state.blocks_since_flush = 0;
  }

  // ---- Main loop over the KV blocks j: blocks that need no mask first, then the rest ----
  const int full_blocks = sequence.tokens_kv / kBlockKv;
  int unmasked_end = full_blocks;
  if constexpr (Config::kCausal) {
    // Causal: block j needs no mask when its last token is visible to the CTA's first row
    const int diagonal_limit = q_begin + position.causal_offset + 1;
    unmasked_end = diagonal_limit <= 0 ? 0 : min(full_blocks, diagonal_limit / kBlockKv);
  }
  int iteration = 0;
  int kv_block = kv.next_block(-1);
  for (; kv_block < unmasked_end; kv_block = kv.next_block(kv_block), ++iteration)
    process_kv_block<Config, false>(state, position, kv, load_block, kv_block, iteration);
  for (; kv_block < kv.block_end; kv_block = kv.next_block(kv_block), ++iteration)
    process_kv_block<Config, true>(state, position, kv, load_block, kv_block, iteration);
  cp_async_wait<0>();

  // ---- Epilogue: l_i from the lanes' shares, O_i = diag(l_i)^-1 O_i, LSE ----
  // Packed: the sequence's rows read again from the offsets rather than held in registers through the KV loop
  const SequenceExtent rows = sequence_extent<Config::kPackedSequences>(params, batch);
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      state.row_sum[row_tile][half] = quad_sum(state.row_sum[row_tile][half]);
  float output[kRowTiles][kOutputTiles][4];
  Epilogue::collect_output(output, state.o_accumulator, state.o_flushed);
  // Packed: the batch stride is 0 and the sequence's rows start at q_base
  unsigned short *o = static_cast<unsigned short *>(params.o) + batch * params.o_strides.batch +
                      head * params.o_strides.head + rows.q_base * params.o_strides.token;
  const float *v_scales = nullptr, *v_mean = nullptr;
  if constexpr (Reads::v_scales && !G::kFp4) // per-channel delta_V
    v_scales = reinterpret_cast<const float *>(workspace + params.offsets.v_scales) + kv_head_index * kHeadDim;
  if constexpr (Reads::v_mean)
    v_mean = reinterpret_cast<const float *>(workspace + params.offsets.v_mean) + kv_head_index * kHeadDim;
  Epilogue::write_output(output, state.row_sum, o, params.o_strides.token, position.first_row, rows.tokens_q,
                         position.quad_lane, v_scales, v_mean);
  if constexpr (Config::kWriteLse) {
    if (params.lse) {
      float correction[kRowTiles][2];
      if constexpr (Reads::k_mean) {
        const float *k_mean =
            reinterpret_cast<const float *>(workspace + params.offsets.k_mean) + kv_head_index * kHeadDim;
        const unsigned short *q_input = static_cast<const unsigned short *>(params.q) + batch * params.q_strides.batch +
                                        head * params.q_strides.head + rows.q_base * params.q_strides.token;
        Epilogue::q_dot_k_mean(correction, q_input, params.q_strides.token, k_mean, position.first_row, rows.tokens_q,
                               position.quad_lane);
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
          for (int half = 0; half < 2; ++half)
            correction[row_tile][half] *= params.softmax_scale; // natural-log units: / sqrt(d)
      } else {
#pragma unroll
        for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
          correction[row_tile][0] = correction[row_tile][1] = 0.0f;
      }
      float *lse = params.lse + batch * params.lse_strides.batch + head * params.lse_strides.head + rows.q_base;
      Epilogue::write_lse(state.row_max, state.row_sum, correction, lse, position.first_row, rows.tokens_q,
                          position.quad_lane);
    }
  }
}

} // namespace sage::device::sm80
