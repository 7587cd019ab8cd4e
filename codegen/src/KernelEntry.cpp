// The main loop and the __global__ function: one CTA per (Q block, q head, batch), the cp.async pipeline over the
// KV blocks, and the calls to the algorithm's steps in the order of Algorithm 1.
#include "KernelText.h"

#include <fmt/format.h>

#include <string>

namespace sage::codegen::detail {
namespace {

using schedules::PvPath;
using schedules::ValueSource;

constexpr std::string_view kState = R"(// ---- The registers one thread keeps across the KV loop ----
struct ThreadState {
  unsigned q_fragment[kRowTiles][kQkSteps][4]; // Q_i as A fragments of the Q.K^T mma
  float q_row_scale[kRowTiles][2];             // delta_Q of rows g and g + 8 (1 when Q is not quantized)
  float row_factor[kRowTiles][2];              // delta_Q x the factor that puts S in base 2
  float row_max[kRowTiles][2];                 // m_i
  float row_sum[kRowTiles][2];                 // this thread's share of l_i (its own columns)
@OUTPUT_STATE@};

// ---- This thread's place in the CTA's tile ----
struct ThreadPosition {
  unsigned shared_base; // shared-memory address of the dynamic buffer
  int warp, lane;
  int quad_lane;        // PTX threadID_in_group: columns 2t, 2t + 1 of each n8 tile
  int first_row;        // sequence row of this thread's row g in row tile 0
  int causal_offset;    // params.causal_offset: key j is visible to row i iff j <= i + causal_offset
};

// ---- Where this CTA's K_j and V_j come from, and which KV blocks it visits ----
struct KvStream {
  const unsigned char *k_codes; // [padded_kv, d] of this KV head
@STREAM_FIELDS@  int tokens_kv, padded_kv;
  int block_end; // one past the last KV block visited
@SPARSE_FIELD@
  // The next KV block visited after `block` (-1: the first one)
  __device__ __forceinline__ int next_block(int block) const {
@NEXT_BLOCK@  }

  // K_j, V_j@SCALES_NOTE@ of KV block `kv_block` into the pipeline stage at `stage_base`, with cp.async
  __device__ __forceinline__ void load(unsigned stage_base, int kv_block) const {
    const int kv_begin = kv_block * kBlockKv;
@LOAD_KEYS@@LOAD_VALUES@@LOAD_SCALES@  }
};

// ---- One step of the main loop: KV block j, in pipeline stage (iteration % kStages) ----
// kMasked: only blocks that cross the end of the sequence@CAUSAL_NOTE@ run the mask code.
template <bool kMasked>
__device__ __forceinline__ void process_kv_block(ThreadState &state, const ThreadPosition &position,
                                                 const KvStream &kv, int &load_block, int kv_block, int iteration) {
  // The stage holds K_j, V_j once at most kStages - 2 younger groups are pending; the barrier also tells every
  // warp that the stage read in the previous iteration may be refilled.
  cp_async_wait<kStages - 2>();
  __syncthreads();
  if (load_block < kv.block_end) {
    kv.load(position.shared_base + kStageOffset + ((iteration + kStages - 1) % kStages) * kStageBytes, load_block);
    load_block = kv.next_block(load_block);
  }
  cp_async_commit();
  const unsigned stage_base = position.shared_base + kStageOffset + (iteration % kStages) * kStageBytes;
  const int kv_begin = kv_block * kBlockKv;
@K_BLOCK_SCALE@@DECODE_STAGE@
  // S_i^j = Q_i K_j^T, then psi^-1 into f32 (base-2 domain)
  ScoreAccumulator score_accumulator[kRowTiles][kScoreTiles][4];
  multiply_q_k(score_accumulator, state.q_fragment, @K_TILE@, position.lane);
  float scores[kRowTiles][kScoreTiles][4];
  @DEQUANTIZE_CALL@;
@Q_MEAN_CORRECTION@  if (kMasked)
    mask_scores(scores, position.first_row, kv_begin, kv.tokens_kv, position.causal_offset, position.quad_lane);

  // m_i^j, P~_i^j (in place of S), l_i^j
  float rescale[kRowTiles][2];
  online_softmax(scores, state.row_max, state.row_sum, rescale);

  // O_i^j = diag(exp2(m_i^(j-1) - m_i^j)) O_i^(j-1) + P~_i^j V_j
  rescale_output(state.o_accumulator, rescale);
@RESCALE_FLUSHED@  unsigned p_fragment[kRowTiles][kPvSteps][4];
@PV_STEP@@FLUSH@}

extern "C" __global__ void __launch_bounds__(kThreads, kMinBlocksPerMultiprocessor)
@NAME@(const SageAttentionParams params) {
  const SageProblemSize size = params.size;
  ThreadPosition position;
  position.shared_base = static_cast<unsigned>(__cvta_generic_to_shared(shared_memory));
  position.warp = static_cast<int>(threadIdx.x) / kWarpSize;
  position.lane = static_cast<int>(threadIdx.x) % kWarpSize;
  position.quad_lane = position.lane % kLanesPerRow;
  position.causal_offset = params.causal_offset;

  // ---- This CTA's Q block i, head and batch; GQA: heads_q / heads_kv q heads share one KV head ----
  const int q_block = kReverseQBlocks ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
  const int head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (size.heads_q / size.heads_kv);
  const int q_begin = q_block * kBlockQ;
  position.first_row = q_begin + position.warp * kRowsPerWarp + position.lane / kLanesPerRow;
  const long long q_head_index = static_cast<long long>(batch) * size.heads_q + head;
  const long long kv_head_index = static_cast<long long>(batch) * size.heads_kv + kv_head;

  // ---- Workspace views of this (batch, head), in the layout of sage/schedules/WorkspaceLayout.h ----
  const unsigned char *workspace = params.workspace;
@Q_SOURCE@  const int kv_blocks = (size.tokens_kv + kBlockKv - 1) / kBlockKv;
  KvStream kv;
  kv.k_codes = workspace + params.offsets.k_codes + kv_head_index * size.padded_kv * @K_CODE_ROW_BYTES@;
@STREAM_SETUP@  kv.tokens_kv = size.tokens_kv;
  kv.padded_kv = size.padded_kv;
@BLOCK_RANGE@
  // ---- Step 1: Q_i -> shared memory (its own cp.async group), the first kStages - 1 K/V tiles behind it ----
@LOAD_Q@  cp_async_commit();
  int load_block = kv.next_block(-1);
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (load_block < kv.block_end) {
      kv.load(position.shared_base + kStageOffset + stage * kStageBytes, load_block);
      load_block = kv.next_block(load_block);
    }
    cp_async_commit(); // possibly empty: keeps one group per stage
  }
  cp_async_wait<kStages - 1>(); // Q_i has landed; K/V may still be in flight
  __syncthreads();
@DECODE_Q@  ThreadState state;
  load_q_fragments(state.q_fragment, position.shared_base + kQTileOffset, position.warp, position.lane);

  // The factor that puts S in the exponent's base-2 domain: @DOMAIN_NOTE@
  const float score_domain_factor = @DOMAIN_FACTOR@;
@Q_SCALES@#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      state.row_factor[row_tile][half] = state.q_row_scale[row_tile][half] * score_domain_factor;
      state.row_max[row_tile][half] = negative_infinity();
      state.row_sum[row_tile][half] = 0.0f;
    }
@ACCUMULATORS@
  // ---- Main loop over the KV blocks j: blocks that need no mask first, then the rest ----
  const int full_blocks = size.tokens_kv / kBlockKv;
@UNMASKED_END@  int iteration = 0;
  int kv_block = kv.next_block(-1);
  for (; kv_block < unmasked_end; kv_block = kv.next_block(kv_block), ++iteration)
    process_kv_block<false>(state, position, kv, load_block, kv_block, iteration);
  for (; kv_block < kv.block_end; kv_block = kv.next_block(kv_block), ++iteration)
    process_kv_block<true>(state, position, kv, load_block, kv_block, iteration);
  cp_async_wait<0>();

  // ---- Epilogue: l_i from the lanes' shares, O_i = diag(l_i)^-1 O_i, LSE ----
#pragma unroll
  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      state.row_sum[row_tile][half] = quad_sum(state.row_sum[row_tile][half]);
  float output[kRowTiles][kOutputTiles][4];
  collect_output(output, state.o_accumulator@FLUSHED_ARGUMENT@);
  unsigned short *o =
      static_cast<unsigned short *>(params.o) + batch * params.o_strides.batch + head * params.o_strides.head;
@EPILOGUE_POINTERS@  write_output(output, state.row_sum, o, params.o_strides.token, position.first_row, size.tokens_q,
               position.quad_lane, @V_SCALES_ARGUMENT@, @V_MEAN_ARGUMENT@);
@LSE@}
)";

std::string domainFactor(const KernelContext &context);

std::string outputState(const KernelContext &context) {
  std::string text = context.plan.pv_path == PvPath::f16_accumulate_f16
                         ? "  unsigned o_accumulator[kRowTiles][kOutputTiles][2]; // O_i, f16x2: rows g, g + 8 x "
                           "channels 2t, 2t + 1\n"
                         : "  float o_accumulator[kRowTiles][kOutputTiles][4];    // O_i\n";
  if (context.two_level)
    text += "  float o_flushed[kRowTiles][kOutputTiles][4];        // two-level: the sum of the flushed accumulators\n"
            "  int blocks_since_flush;\n";
  return text;
}

std::string streamFields(const KernelContext &context) {
  std::string text;
  if (context.smoothed_q)
    text += "  const float *delta_s;         // Q smoothing: the prologue's delta_s of this CTA's Q block [padded_kv]\n"
            "  float delta_factor;           // puts delta_s in S's domain\n";
  if (context.fp4)
    return text + "  const unsigned char *k_scales; // K's microscales [padded_kv, d / group] of this KV head\n"
                  "  const unsigned char *v_codes;  // V^T's e2m1 codes [d, padded_kv / 2] of this KV head\n"
                  "  const unsigned char *v_scales; // V^T's microscales [d, padded_kv / group] of this KV head\n";
  if (context.quantized_qk)
    text += "  const float *k_scales;        // K's scales of this KV head\n";
  if (context.plan.v_source == ValueSource::workspace_codes)
    text += "  const unsigned char *v_codes; // V^T codes [d, padded_kv] of this KV head\n";
  else
    text += "  const unsigned char *v_rows;  // f16 V [tokens, d] of this KV head\n"
            "  long long v_row_stride;       // bytes between V's rows\n";
  return text;
}

std::string streamSetup(const KernelContext &context) {
  std::string text;
  if (context.smoothed_q)
    text += fmt::format(
        "  // Q smoothing: delta_s [b, h_q, padded_q / {0}, padded_kv], per Q block of the variant ({0} rows)\n"
        "  kv.delta_s = reinterpret_cast<const float *>(workspace + params.offsets.delta_s) +\n"
        "               (q_head_index * (size.padded_q / {0}) + q_begin / {0}) * size.padded_kv;\n"
        "  kv.delta_factor = {1};\n",
        context.variant.block_q, domainFactor(context));
  if (context.fp4)
    return text +
           "  // FP4: K's scales, V^T's codes and scales, as the prologue wrote them (codegen/README.md, FP4 "
           "operands)\n"
           "  kv.k_scales = workspace + params.offsets.k_scales + kv_head_index * size.k_scale_count;\n"
           "  kv.v_codes = workspace + params.offsets.v_codes + kv_head_index * kHeadDim * (size.padded_kv / 2);\n"
           "  kv.v_scales = workspace + params.offsets.v_scales +\n"
           "                kv_head_index * kHeadDim * (size.padded_kv / kFp4Group);\n";
  if (context.quantized_qk)
    text += "  kv.k_scales =\n"
            "      reinterpret_cast<const float *>(workspace + params.offsets.k_scales) + kv_head_index * "
            "size.k_scale_count;\n";
  switch (context.plan.v_source) {
  case ValueSource::input:
    text += "  // V: the caller's f16 tensor, read in place (rows may be strided: HND or NHD)\n"
            "  constexpr int kValueBytes = 2;\n"
            "  kv.v_row_stride = params.v_strides.token * kValueBytes;\n"
            "  kv.v_rows = static_cast<const unsigned char *>(params.v) +\n"
            "              (batch * params.v_strides.batch + kv_head * params.v_strides.head) * kValueBytes;\n";
    break;
  case ValueSource::workspace_values:
    text += "  // V: the prologue's f16 copy (converted from bf16 and/or smoothed)\n"
            "  kv.v_row_stride = kVRowBytes;\n"
            "  kv.v_rows = workspace + params.offsets.v_values + kv_head_index * size.padded_kv * kVRowBytes;\n";
    break;
  case ValueSource::workspace_codes:
    text += "  kv.v_codes = workspace + params.offsets.v_codes + kv_head_index * kHeadDim * size.padded_kv;\n";
    break;
  }
  return text;
}

std::string nextBlock(const KernelContext &context) {
  if (!context.block_sparse)
    return "    return block + 1;\n";
  return "    ++block;\n"
         "    while (kept_blocks && block < block_end && kept_blocks[block] == 0)\n"
         "      ++block;\n"
         "    return block;\n";
}

std::string loadKeys(const KernelContext &context) {
  if (context.fp4)
    return "    copy_tile_async<kBlockKv, kKCodeRowBytes, false>(\n"
           "        stage_base + kKCodesOffset, k_codes + static_cast<long long>(kv_begin) * kKCodeRowBytes, "
           "kKCodeRowBytes, kBlockKv);\n"
           "    // K_j's scales are contiguous: copied as 16-byte rows\n"
           "    copy_tile_async<kBlockKv * kKScaleRowBytes / kChunkBytes, kChunkBytes, false>(\n"
           "        stage_base + kKScalesOffset, k_scales + static_cast<long long>(kv_begin) * kKScaleRowBytes, "
           "kChunkBytes,\n"
           "        kBlockKv * kKScaleRowBytes / kChunkBytes);\n";
  return "    copy_tile_async<kBlockKv, kKRowBytes, false>(stage_base + kKTileOffset,\n"
         "                                                 k_codes + static_cast<long long>(kv_begin) * kKRowBytes, "
         "kKRowBytes,\n"
         "                                                 kBlockKv);\n";
}

std::string loadValues(const KernelContext &context) {
  if (context.fp4) // V_j^T's scales are read from the workspace by the decode (rows of b_kv / group bytes)
    return "    copy_tile_async<kHeadDim, kVCodeRowBytes, false>(stage_base + kVCodesOffset, v_codes + kv_begin / 2, "
           "padded_kv / 2,\n"
           "                                                      kHeadDim);\n";
  if (context.plan.v_source == ValueSource::workspace_codes)
    return "    copy_tile_async<kVRows, kVRowBytes, false>(stage_base + kVTileOffset, v_codes + kv_begin, padded_kv, "
           "kVRows);\n";
  return "    copy_tile_async<kVRows, kVRowBytes, true>(stage_base + kVTileOffset, v_rows + kv_begin * v_row_stride,\n"
         "                                              v_row_stride, tokens_kv - kv_begin); // past the end: 0\n";
}

std::string loadScales(const KernelContext &context) {
  if (!context.staged_k_scales)
    return "";
  return "    const float *block_scales = k_scales + scale_group<kKScaleTokensPerGroup, kKScaleInterleave>(kv_begin);\n"
         "    for (int slot = threadIdx.x; slot < kKScalesPerBlock; slot += kThreads)\n"
         "      cp_async_4(stage_base + kKScalesOffset + slot * static_cast<int>(sizeof(float)), block_scales + "
         "slot);\n";
}

std::string blockRange(const KernelContext &context) {
  std::string text;
  if (context.causal)
    text += "  // Causal: blocks after the diagonal of this Q block's last row are skipped\n"
            "  const int last_visible_token = min(q_begin + kBlockQ, size.tokens_q) - 1 + position.causal_offset;\n"
            "  kv.block_end = last_visible_token < 0 ? 0 : min(kv_blocks, last_visible_token / kBlockKv + 1);\n";
  else
    text += "  kv.block_end = kv_blocks;\n";
  if (context.block_sparse)
    text +=
        "  // Block-sparse: KV blocks whose block_mask[b, h, i, j] is 0 are skipped (no mask: every block)\n"
        "  const int q_blocks = (size.tokens_q + kBlockQ - 1) / kBlockQ;\n"
        "  kv.kept_blocks =\n"
        "      params.block_mask ? params.block_mask + (q_head_index * q_blocks + q_block) * kv_blocks : nullptr;\n";
  return text;
}

// With the scale folded by the prologue S is already in base 2 (times log2 e when the variant asked for the
// natural base); otherwise 1/sqrt(d) log2(e) is applied here.
std::string domainFactor(const KernelContext &context) {
  if (!context.variant.q.fold_softmax_scale)
    return "params.softmax_scale * kLog2e";
  return context.variant.exp2_softmax ? "1.0f" : "kLog2e";
}

std::string domainNote(const KernelContext &context) {
  if (!context.variant.q.fold_softmax_scale)
    return "1/sqrt(d) x log2(e)";
  return context.variant.exp2_softmax ? "1 (the prologue folded 1/sqrt(d) log2(e) into Q)"
                                      : "log2(e) (the prologue folded 1/sqrt(d) into Q)";
}

std::string accumulators(const KernelContext &context) {
  std::string text;
  if (context.plan.pv_path == PvPath::f16_accumulate_f16)
    text = "#pragma unroll\n"
           "  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
           "#pragma unroll\n"
           "    for (int tile = 0; tile < kOutputTiles; ++tile)\n"
           "      state.o_accumulator[row_tile][tile][0] = state.o_accumulator[row_tile][tile][1] = 0u;\n";
  else
    text = "#pragma unroll\n"
           "  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
           "#pragma unroll\n"
           "    for (int tile = 0; tile < kOutputTiles; ++tile)\n"
           "#pragma unroll\n"
           "      for (int i = 0; i < 4; ++i)\n"
           "        state.o_accumulator[row_tile][tile][i] = 0.0f;\n";
  if (context.two_level)
    text += "#pragma unroll\n"
            "  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
            "#pragma unroll\n"
            "    for (int tile = 0; tile < kOutputTiles; ++tile)\n"
            "#pragma unroll\n"
            "      for (int i = 0; i < 4; ++i)\n"
            "        state.o_flushed[row_tile][tile][i] = 0.0f;\n"
            "  state.blocks_since_flush = 0;\n";
  return text;
}

std::string dequantizeCall(const KernelContext &context) {
  if (!context.quantized_qk)
    return "dequantize_scores(scores, score_accumulator, state.row_factor)";
  if (context.staged_k_scales)
    return "dequantize_scores(scores, score_accumulator, state.row_factor,\n"
           "                    reinterpret_cast<const float *>(shared_memory + (stage_base - position.shared_base) + "
           "kKScalesOffset),\n"
           "                    kv_begin, position.quad_lane)";
  return "dequantize_scores(scores, score_accumulator, state.row_factor, k_block_scale)";
}

// The per-stage decode of K_j and V_j^T (FP4), and the tiles the mma path reads.
std::string decodeStage(const KernelContext &context) {
  if (!context.fp4)
    return "";
  return "  // K_j and V_j^T: e2m1 codes x microscales decoded to 16-bit tiles (exact); the barrier at the top of "
         "this\n"
         "  // step has seen every warp finish reading the previous tiles\n"
         "  Fp4Steps::decode_fp4_tile<kBlockKv, kHeadDim>(position.shared_base + kKDecodedOffset,\n"
         "      stage_base + kKCodesOffset,\n"
         "      shared_memory + (stage_base - position.shared_base) + kKScalesOffset, kKScaleRowBytes);\n"
         "  Fp4Steps::decode_fp4_tile<kHeadDim, kBlockKv>(position.shared_base + kVDecodedOffset,\n"
         "      stage_base + kVCodesOffset, kv.v_scales + kv_begin / kFp4Group, kv.padded_kv / kFp4Group);\n"
         "  __syncthreads();\n";
}

std::string pvStep(const KernelContext &context) {
  if (context.fp4)
    return "  float p_row_scale[kRowTiles][2]; // s_P1 (two-level P), else 1\n"
           "  ValueSteps::quantize_probabilities(p_fragment, p_row_scale, scores);\n"
           "  ValueSteps::multiply_p_v(state.o_accumulator, p_fragment, p_row_scale,\n"
           "                           position.shared_base + kVDecodedOffset, position.lane);\n";
  return "  ValueSteps::pack_probabilities(p_fragment, scores);\n"
         "  ValueSteps::multiply_p_v(state.o_accumulator, p_fragment, stage_base + kVTileOffset, position.lane);\n";
}

std::string qSource(const KernelContext &context) {
  if (context.fp4)
    return "  const unsigned char *q_codes =\n"
           "      workspace + params.offsets.q_codes + (q_head_index * size.padded_q + q_begin) * kQCodeRowBytes;\n"
           "  const unsigned char *q_scales =\n"
           "      workspace + params.offsets.q_scales + q_head_index * size.q_scale_count + q_begin * "
           "kQScaleRowBytes;\n";
  return "  const unsigned char *q_codes =\n"
         "      workspace + params.offsets.q_codes + (q_head_index * size.padded_q + q_begin) * kQRowBytes;\n";
}

std::string loadQ(const KernelContext &context) {
  if (context.fp4)
    return "  copy_tile_async<kBlockQ, kQCodeRowBytes, false>(position.shared_base + kQCodesOffset, q_codes, "
           "kQCodeRowBytes,\n"
           "                                                 kBlockQ);\n"
           "  copy_tile_async<kBlockQ * kQScaleRowBytes / kChunkBytes, kChunkBytes, false>(\n"
           "      position.shared_base + kQScalesOffset, q_scales, kChunkBytes, kBlockQ * kQScaleRowBytes / "
           "kChunkBytes);\n";
  return "  copy_tile_async<kBlockQ, kQRowBytes, false>(position.shared_base + kQTileOffset, q_codes, kQRowBytes, "
         "kBlockQ);\n";
}

std::string decodeQ(const KernelContext &context) {
  if (!context.fp4)
    return "";
  return "  // FP4: Q_i's codes x microscales decoded once into the Q tile; its staging bytes are K_j's decoded tile "
         "next\n"
         "  Fp4Steps::decode_fp4_tile<kBlockQ, kHeadDim>(position.shared_base + kQTileOffset,\n"
         "                                               position.shared_base + kQCodesOffset,\n"
         "                                               shared_memory + kQScalesOffset, kQScaleRowBytes);\n"
         "  __syncthreads();\n";
}

std::string epiloguePointers(const KernelContext &context) {
  std::string text;
  if (context.plan.v_source == ValueSource::workspace_codes && !context.fp4)
    text += "  const float *v_scales = reinterpret_cast<const float *>(workspace + params.offsets.v_scales) + "
            "kv_head_index * kHeadDim;\n";
  if (context.smoothed_v)
    text += "  const float *v_mean = reinterpret_cast<const float *>(workspace + params.offsets.v_mean) + "
            "kv_head_index * kHeadDim;\n";
  return text;
}

std::string lse(const KernelContext &context) {
  if (!context.variant.epilogue.write_lse)
    return "";
  std::string text = "  if (params.lse) {\n"
                     "    float correction[kRowTiles][2];\n";
  if (context.lse_correction) {
    text += "    const float *k_mean = reinterpret_cast<const float *>(workspace + params.offsets.k_mean) + "
            "kv_head_index * kHeadDim;\n"
            "    const unsigned short *q_input = static_cast<const unsigned short *>(params.q) +\n"
            "                                    batch * params.q_strides.batch + head * params.q_strides.head;\n"
            "    q_dot_k_mean(correction, q_input, params.q_strides.token, k_mean, position.first_row, "
            "size.tokens_q,\n"
            "                 position.quad_lane);\n"
            "#pragma unroll\n"
            "    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
            "#pragma unroll\n"
            "      for (int half = 0; half < 2; ++half)\n"
            "        correction[row_tile][half] *= params.softmax_scale; // natural-log units: / sqrt(d)\n";
  } else {
    text += "#pragma unroll\n"
            "    for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
            "      correction[row_tile][0] = correction[row_tile][1] = 0.0f;\n";
  }
  text += "    write_lse(state.row_max, state.row_sum, correction, params.lse + q_head_index * size.tokens_q,\n"
          "              position.first_row, size.tokens_q, position.quad_lane);\n"
          "  }\n";
  return text;
}

} // namespace

std::string emitKernelEntry(const KernelContext &context) {
  const bool codes = context.plan.v_source == ValueSource::workspace_codes && !context.fp4; // per-channel delta_V
  const std::string q_scales =
      context.quantized_qk
          ? "  const float *q_scales =\n"
            "      reinterpret_cast<const float *>(workspace + params.offsets.q_scales) + q_head_index * "
            "size.q_scale_count;\n"
            "  load_q_row_scales(state.q_row_scale, q_scales, position.first_row);\n"
          : "#pragma unroll\n"
            "  for (int row_tile = 0; row_tile < kRowTiles; ++row_tile)\n"
            "    state.q_row_scale[row_tile][0] = state.q_row_scale[row_tile][1] = 1.0f; // unquantized Q\n";
  const std::string k_block_scale =
      context.quantized_qk && !context.staged_k_scales
          ? "  const float k_block_scale = kv.k_scales[scale_group<kKScaleTokensPerGroup, "
            "kKScaleInterleave>(kv_begin)];\n"
          : "";
  return substitute(
      kState,
      {{"OUTPUT_STATE", outputState(context)},
       {"STREAM_FIELDS", streamFields(context)},
       {"SPARSE_FIELD", context.block_sparse
                            ? "  const unsigned char *kept_blocks; // block_mask[b, h, i, :] (1 = visit), or null\n"
                            : ""},
       {"NEXT_BLOCK", nextBlock(context)},
       {"SCALES_NOTE", context.staged_k_scales ? " and K_j's scales" : ""},
       {"LOAD_KEYS", loadKeys(context)},
       {"LOAD_VALUES", loadValues(context)},
       {"LOAD_SCALES", loadScales(context)},
       {"CAUSAL_NOTE", context.causal ? " or the causal diagonal" : ""},
       {"K_BLOCK_SCALE", k_block_scale},
       {"DECODE_STAGE", decodeStage(context)},
       {"K_TILE", context.fp4 ? "position.shared_base + kKDecodedOffset" : "stage_base + kKTileOffset"},
       {"PV_STEP", pvStep(context)},
       {"Q_SOURCE", qSource(context)},
       {"K_CODE_ROW_BYTES", context.fp4 ? "kKCodeRowBytes" : "kKRowBytes"},
       {"LOAD_Q", loadQ(context)},
       {"DECODE_Q", decodeQ(context)},
       {"DEQUANTIZE_CALL", dequantizeCall(context)},
       {"Q_MEAN_CORRECTION",
        context.smoothed_q
            ? "  add_q_mean_correction(scores, kv.delta_s + kv_begin, kv.delta_factor, position.quad_lane);\n"
            : ""},
       {"RESCALE_FLUSHED", context.two_level ? "  rescale_output(state.o_flushed, rescale);\n" : ""},
       {"FLUSH", context.two_level ? "  if (++state.blocks_since_flush == kFlushPeriod) { // two-level accumulation\n"
                                     "    flush_accumulator(state.o_flushed, state.o_accumulator);\n"
                                     "    state.blocks_since_flush = 0;\n"
                                     "  }\n"
                                   : ""},
       {"NAME", context.name},
       {"STREAM_SETUP", streamSetup(context)},
       {"BLOCK_RANGE", blockRange(context)},
       {"DOMAIN_NOTE", domainNote(context)},
       {"DOMAIN_FACTOR", domainFactor(context)},
       {"Q_SCALES", q_scales},
       {"ACCUMULATORS", accumulators(context)},
       {"UNMASKED_END",
        context.causal
            ? "  // Causal: block j needs no mask when its last token is visible to the CTA's first row\n"
              "  const int diagonal_limit = q_begin + position.causal_offset + 1;\n"
              "  const int unmasked_end = diagonal_limit <= 0 ? 0 : min(full_blocks, diagonal_limit / kBlockKv);\n"
            : "  const int unmasked_end = full_blocks;\n"},
       {"FLUSHED_ARGUMENT", context.two_level ? ", state.o_flushed" : ""},
       {"EPILOGUE_POINTERS", epiloguePointers(context)},
       {"V_SCALES_ARGUMENT", codes ? "v_scales" : "nullptr"},
       {"V_MEAN_ARGUMENT", context.smoothed_v ? "v_mean" : "nullptr"},
       {"LSE", lse(context)}});
}

} // namespace sage::codegen::detail
