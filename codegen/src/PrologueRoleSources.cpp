// The role functions of the generated prologue kernels: what one CTA of each role does. Lines that depend on
// the variant (prescale, smoothing, per-tensor scales, V's output) are added only when the variant has them.
#include "sage/codegen/PrologueDeviceCode.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace sage::codegen::prologue {
namespace {

bool has(const std::vector<PrologueRole> &roles, PrologueRole role) {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

// Replaces the one occurrence of `from` in `text` (a generator bug if it is missing).
void replaceOnce(std::string &text, const std::string &from, const std::string &to) {
  const size_t at = text.find(from);
  if (at == std::string::npos || text.find(from, at + 1) != std::string::npos)
    throw std::logic_error("prologue generator: expected one \"" + from + "\" in the generated text");
  text.replace(at, from.size(), to);
}

std::string functionHead(const std::string &comment, const std::string &name) {
  const std::string head = "__device__ __forceinline__ void " + name + "(";
  const std::string parameters = "const SagePrologueParams &params, long long cta, unsigned char *shared) {\n";
  if (head.size() + parameters.size() <= 121)
    return "\n" + comment + head + parameters;
  return "\n" + comment + head + "\n    " + parameters;
}

std::string qBlockSupport(const PrologueConfig &config) {
  std::string text = "\n// One Q block of kBlockQ tokens in registers, and the x that psi_Q quantizes";
  text += config.fold_q_scale || config.smooth_q ? ":\n" : " (Q itself).\n";
  if (config.fold_q_scale)
    text += "//   x = Q * q_prescale: the softmax scale 1/sqrt(d) * log2(e) folded into psi_Q (paper 4.6), one f32 "
            "multiply\n";
  if (config.smooth_q)
    text += "//   x = x - mean of the block's x per channel: Q smoothing (SageAttention2), one f32 subtraction\n";
  text += "// Rows past the sequence are 0.\nstruct QBlock {\n";
  text += "  TokenTile<kBlockQ> tile;\n";
  text += "  int valid_rows; // tokens of this block inside the sequence\n";
  if (config.fold_q_scale)
    text += "  float prescale; // params.q_prescale\n";
  if (config.smooth_q)
    text += "  float mean[kVectorElements]; // the block mean of this thread's channels\n";
  text += "\n  __device__ __forceinline__ float scaled(int pass, int j) const { return ";
  text += config.fold_q_scale ? "__fmul_rn(tile.element(pass, j), prescale); }\n" : "tile.element(pass, j); }\n";
  text += "  __device__ __forceinline__ float operator()(int pass, int j) const {\n";
  if (config.smooth_q)
    text += "    return TokenTile<kBlockQ>::row(pass) < valid_rows ? __fsub_rn(scaled(pass, j), mean[j]) : 0.0f;\n";
  else
    text += "    return scaled(pass, j);\n";
  text += "  }\n};\n";

  text += R"cuda(
// Loads Q block `block` of head `head` (= batch index * heads_q + head index))cuda";
  text += config.smooth_q ? "; computes its mean, stored to q_mean when\n// `store_mean`.\n" : ".\n";
  text += R"cuda(__device__ __forceinline__ void loadQBlock(QBlock &q, const SagePrologueParams &params, long long head,
                                           int block, unsigned char *shared, bool store_mean) {
  const long long token_stride = params.q_strides.token;
  q.valid_rows = min(kBlockQ, params.size.tokens_q - block * kBlockQ);
  q.tile.load(headPointer(params.q, params.q_strides, head, params.size.heads_q) +
                  (long long)block * kBlockQ * token_stride,
              token_stride, q.valid_rows);
)cuda";
  if (config.fold_q_scale)
    text += "  q.prescale = params.q_prescale;\n";
  if (config.smooth_q)
    text += R"cuda(  // Q smoothing: the block's per-channel mean of x over its tokens inside the sequence.
  float *block_mean = (float *)(shared + kTileMeansOffset);
  tileColumnMeans<TokenTile<kBlockQ>>([&](int pass, int j) { return q.scaled(pass, j); }, q.valid_rows,
                                      (float *)shared, block_mean);
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    q.mean[j] = block_mean[TokenTile<kBlockQ>::channel() + j];
  if (store_mean) {
    float *q_mean = workspaceFloats(params, params.offsets.q_mean) +
                    (head * (params.size.padded_q / kBlockQ) + block) * kHeadDim;
    for (int c = threadIdx.x; c < kHeadDim; c += kThreads)
      q_mean[c] = block_mean[c];
  }
)cuda";
  else
    text += "  (void)shared;\n  (void)store_mean;\n";
  text += "}\n";
  return text;
}

std::string kBlockSupport(const PrologueConfig &config) {
  std::string text = "\n// kKBlocksPerTile KV blocks of K in registers, and the x that psi_K quantizes";
  if (!config.smooth_k)
    return text + R"cuda( (K itself; rows past the sequence are
// 0).
struct KTile {
  TokenTile<kKTileTokens> tile;
  __device__ __forceinline__ float operator()(int pass, int j) const { return tile.element(pass, j); }
};
)cuda";
  return text + R"cuda(: gamma(K) = K - mean(K), the
// smoothing of paper 4.2 (one f32 subtraction, mean(K) over the whole sequence, combined from launch 1's
// slices). Rows past the sequence are 0.
struct KTile {
  TokenTile<kKTileTokens> tile;
  int valid_rows;              // tokens of this tile inside the sequence
  float mean[kVectorElements]; // mean(K) of this thread's channels

  __device__ __forceinline__ float operator()(int pass, int j) const {
    return TokenTile<kKTileTokens>::row(pass) < valid_rows ? __fsub_rn(tile.element(pass, j), mean[j]) : 0.0f;
  }
};
)cuda";
}

// Q smoothing's correction, written by the K tiles (launch 2, after launch 1's q_mean): the GEMV of
// sage.q_mean_correction.
std::string qMeanCorrectionSupport() {
  return R"cuda(
// delta_s [b, h_q, q_blocks, padded_kv] = q_mean[Q block] . x_K[token] for every Q head of this KV head (GQA) and
// every Q block, where x_K is what psi_K quantizes (K, or gamma(K) when K is smoothed): f32 products summed over
// this thread's 8 channels, then over the kVectorsPerRow lanes of the row. Padded tokens get 0.
__device__ __forceinline__ float rowSum(float value) {
#pragma unroll
  for (int offset = kVectorsPerRow / 2; offset > 0; offset /= 2)
    value = __fadd_rn(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

__device__ __forceinline__ void writeQMeanCorrection(const KTile &k, const SagePrologueParams &params, long long head,
                                                     int first, int stored_rows) {
  using Tile = TokenTile<kKTileTokens>;
  const int group = params.size.heads_q / params.size.heads_kv;
  const long long first_q_head =
      head / params.size.heads_kv * params.size.heads_q + head % params.size.heads_kv * group;
  const int q_blocks = params.size.padded_q / kBlockQ;
  const float *q_mean = workspaceFloats(params, params.offsets.q_mean);
  float *delta_s = workspaceFloats(params, params.offsets.delta_s);
  for (long long block = first_q_head * q_blocks; block < (first_q_head + group) * q_blocks; ++block) {
    float mean[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j)
      mean[j] = q_mean[block * kHeadDim + Tile::channel() + j];
    float *delta = delta_s + block * params.size.padded_kv + first;
#pragma unroll
    for (int pass = 0; pass < Tile::kPasses; ++pass) {
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kVectorElements; ++j)
        sum = __fmaf_rn(mean[j], k(pass, j), sum);
      sum = rowSum(sum); // every lane takes part in the shuffles
      if (Tile::inTile(pass) && Tile::row(pass) < stored_rows && (int)threadIdx.x % kVectorsPerRow == 0)
        delta[Tile::row(pass)] = sum;
    }
  }
}
)cuda";
}

// Microscaled (FP4) Q and K: the codes and scales of a tile's rows.
std::string microscaledTileSupport() {
  return R"cuda(
// FP4 along the channels of each token: a thread holds 8 channels of a row, so a group of Quantizer::kGroupChannels
// channels is kGroupChannels / 8 neighbouring lanes; its amax is their max (shuffles), its scale byte is stored by
// the group's first lane. Codes: 4 bytes (8 nibbles) per thread and row; rows past `stored_rows` are not stored.
template <class Quantizer, class Values>
__device__ __forceinline__ void storeMicroscaledTile(const Values &values, unsigned char *codes, unsigned char *scales,
                                                     int stored_rows) {
  using Tile = TokenTile<Quantizer::kTileTokens>;
#pragma unroll
  for (int pass = 0; pass < Tile::kPasses; ++pass) {
    float x[kVectorElements];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j) {
      x[j] = values(pass, j);
      amax = sage::device::fp4::max_magnitude(amax, x[j]);
    }
#pragma unroll
    for (int offset = 1; offset < Quantizer::kGroupChannels / kVectorElements; offset *= 2)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset)); // every lane takes part
    const unsigned scale = Quantizer::scaleCode(amax);
    const int row = Tile::row(pass), channel = Tile::channel();
    if (!Tile::inTile(pass) || row >= stored_rows)
      continue;
    *(unsigned *)(codes + (long long)row * (kHeadDim / 2) + channel / 2) =
        sage::device::fp4::pack_e2m1x8(x, Quantizer::inverse(scale));
    if (channel % Quantizer::kGroupChannels == 0)
      scales[(long long)row * (kHeadDim / Quantizer::kGroupChannels) + channel / Quantizer::kGroupChannels] =
          (unsigned char)scale;
  }
}
)cuda";
}

std::string kStatisticsSupport(const PrologueConfig &config) {
  std::string text = "\n// ";
  text += config.smooth_k ? "mean(K) (the slices' sums in slice order, one f32 division)" : "";
  text += config.smooth_k && config.kMinMax() ? " and " : "";
  text += config.kMinMax() ? "the amax of the per-tensor psi_K" : "";
  text += R"cuda( over the whole sequence, combined
// from launch 1's slices. Every K tile computes the same values; the first tile of a head stores them (k_mean,
// and quantizeKTile the per-tensor scale). Returns the amax (0 without a per-tensor psi_K).
)cuda";
  text +=
      R"cuda(__device__ __forceinline__ float combineKStatistics(const SagePrologueParams &params, long long head, bool store,
                                                    float *channel_mean, unsigned *amax_slot) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  float tensor_amax = 0.0f;
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
)cuda";
  if (config.smooth_k)
    text += R"cuda(    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice)
      sum = __fadd_rn(sum, scratch.k_sum[first_entry + slice * kHeadDim]);
    const float mean = __fdiv_rn(sum, (float)params.size.tokens_kv);
    channel_mean[c] = mean;
    if (store)
      workspaceFloats(params, params.offsets.k_mean)[head * kHeadDim + c] = mean;
)cuda";
  else
    text += "    (void)channel_mean;\n    (void)store;\n";
  if (config.kMinMax()) {
    text += R"cuda(    float low = positiveInfinity(), high = -positiveInfinity();
    for (int slice = 0; slice < slices; ++slice) {
      low = fminf(low, inputToFloat(scratch.k_min[first_entry + slice * kHeadDim]));
      high = fmaxf(high, inputToFloat(scratch.k_max[first_entry + slice * kHeadDim]));
    }
)cuda";
    if (config.smooth_k)
      text += R"cuda(    // max |K - mean(K)|: x -> x - mean is monotonic in f32, so min and max bound every token.
    tensor_amax = fmaxf(tensor_amax, fmaxf(fabsf(__fsub_rn(high, mean)), fabsf(__fsub_rn(low, mean))));
)cuda";
    else
      text += "    tensor_amax = fmaxf(tensor_amax, fmaxf(fabsf(high), fabsf(low)));\n";
    text += "  }\n  return ctaMax(tensor_amax, amax_slot); // its barriers also publish channel_mean\n}\n";
  } else {
    text += "  }\n  (void)amax_slot;\n  __syncthreads();\n  return tensor_amax;\n}\n";
  }
  return text;
}

std::string vStatisticsSupport(const PrologueConfig &config) {
  const bool codes = config.v_output == VOutput::codes;
  std::string text = "\n// ";
  text += config.smooth_v ? "mean(V)" : "";
  text += config.smooth_v && codes ? " and " : "";
  text += codes ? "the per-channel amax of psi_V" : "";
  text += R"cuda( over the whole sequence, combined from launch 1's slices in slice
// order. Every V tile computes the same values; tile 0 stores them (v_mean, v_scales).
__device__ __forceinline__ void combineVStatistics(const SagePrologueParams &params, long long head,
                                                   bool store, float *channel_mean, float *channel_inverse) {
  const int slices = statisticsSlices(params.size);
  const StatisticsScratch scratch = statisticsScratch(params);
  for (int c = threadIdx.x; c < kHeadDim; c += kThreads) {
    const long long first_entry = head * slices * kHeadDim + c;
)cuda";
  if (config.smooth_v)
    text += R"cuda(    float sum = 0.0f;
    for (int slice = 0; slice < slices; ++slice)
      sum = __fadd_rn(sum, scratch.v_sum[first_entry + slice * kHeadDim]);
    const float mean = __fdiv_rn(sum, (float)params.size.tokens_kv);
    channel_mean[c] = mean;
    if (store)
      workspaceFloats(params, params.offsets.v_mean)[head * kHeadDim + c] = mean;
)cuda";
  else
    text += "    (void)channel_mean;\n";
  if (codes) {
    text += R"cuda(    float low = positiveInfinity(), high = -positiveInfinity();
    for (int slice = 0; slice < slices; ++slice) {
      low = fminf(low, inputToFloat(scratch.v_min[first_entry + slice * kHeadDim]));
      high = fmaxf(high, inputToFloat(scratch.v_max[first_entry + slice * kHeadDim]));
    }
)cuda";
    if (config.smooth_v)
      text += R"cuda(    // max |V - mean(V)|: x -> x - mean is monotonic in f32, so min and max bound every token.
    const float amax = fmaxf(fabsf(__fsub_rn(high, mean)), fabsf(__fsub_rn(low, mean)));
)cuda";
    else
      text += "    const float amax = fmaxf(fabsf(high), fabsf(low));\n";
    text += R"cuda(    const SymmetricScale scale = symmetricScale(amax, kVCodeMax);
    channel_inverse[c] = scale.inverse;
    if (store)
      workspaceFloats(params, params.offsets.v_scales)[head * kHeadDim + c] = scale.scale;
)cuda";
  } else {
    text += "    (void)channel_inverse;\n";
  }
  text += "  }\n  __syncthreads();\n}\n";
  return text;
}

std::string vCodeSupport(const PrologueConfig &config) {
  const bool e4m3 = config.v_dtype == ElementType::e4m3;
  std::string text = "\n// Per-channel psi_V: ";
  text += e4m3 ? "e4m3 codes, scale = amax / 448" : "int8 codes, scale = amax / 127";
  text += " over all tokens of the channel (paper 4.3).\n";
  text += std::string("[[maybe_unused]] constexpr float kVCodeMax = ") + (e4m3 ? "448.0f" : "127.0f") + ";\n";
  text += std::string("__device__ __forceinline__ unsigned vCode(float scaled) { return ") +
          (e4m3 ? "e4m3Code" : "int8Code") + "(scaled); }\n";
  text += R"cuda(
// Shared-memory swizzle of a transposed V tile: XOR-ing a word index with a multiple of 32 / kVectorsPerRow per
// 8-channel group keeps both the transposing writes and the row reads free of bank conflicts.
__device__ __forceinline__ int vTileSwizzle(int channel) {
  return channel / kVectorElements * (32 / kVectorsPerRow) % 32;
}
)cuda";
  if (config.interleavedVCodes())
    text += R"cuda(
// v_codes' token axis in the token order of the Hopper wgmma P.V (WorkspaceLayout.h): position p of each 32-token
// group holds this token, so that an 8-bit A fragment (k = 4q + {0..3}, 16 + 4q + {0..3}) matches the S
// accumulator columns (8j + 2q + {0, 1}) its thread already holds.
__device__ __forceinline__ int vTokenAtPosition(int position) {
  const int p = position % 32;
  return position - p + 16 * (p / 16) + 8 * (p % 4 / 2) + 2 * (p % 16 / 4) + p % 2;
}
)cuda";
  return text;
}

// ---- the role functions ----

std::string columnStatistics(const PrologueConfig &config, bool k) {
  const bool sum = k ? config.smooth_k : config.smooth_v;
  const bool min_max = k ? config.kMinMax() : config.vMinMax();
  std::string comment = "// Launch 1, " + std::string(k ? "K" : "V") + ": ";
  if (k)
    comment += sum && min_max ? "the per-channel sums for mean(K) (gamma(K) = K - mean(K), paper 4.2)\n// and "
                                "min/max for the per-tensor psi_K"
               : sum          ? "the per-channel sums for mean(K) (gamma(K) = K - mean(K), paper 4.2)"
                              : "the per-channel min/max for the per-tensor psi_K";
  else
    comment += sum && min_max ? "the per-channel sums for mean(V) and min/max for the per-channel psi_V"
               : sum          ? "the per-channel sums for mean(V) (V smoothing)"
                              : "the per-channel min/max for the per-channel psi_V (paper 4.3)";
  comment += ",\n// over one slice of one KV head's tokens, into prologue_statistics. Launch 2 combines the slices in "
             "order.\n";
  const std::string tensor = k ? "k" : "v";
  std::string text = functionHead(comment, k ? "reduceKColumns" : "reduceVColumns");
  text += R"cuda(  const int slices = statisticsSlices(params.size);
  const long long head = cta / slices; // batch index * heads_kv + KV head index
  const int slice = (int)(cta % slices);
  const int slice_tokens = statisticsSliceTokens(params.size);
  const int begin = slice * slice_tokens;
  const int end = min(params.size.tokens_kv, begin + slice_tokens);
  const StatisticsScratch scratch = statisticsScratch(params);
  const long long entry = (head * slices + slice) * kHeadDim;
)cuda";
  text += "  reduceColumns<" + std::string(sum ? "true" : "false") + ", " + (min_max ? "true" : "false") + ">(\n";
  text += "      headPointer(params." + tensor + ", params." + tensor +
          "_strides, head, params.size.heads_kv), params." + tensor + "_strides.token, begin, end,\n";
  text += "      (float *)shared, " + (sum ? "scratch." + tensor + "_sum + entry" : std::string("nullptr")) + ", " +
          (min_max ? "scratch." + tensor + "_min + entry, scratch." + tensor + "_max + entry"
                   : std::string("nullptr, nullptr")) +
          ");\n}\n";
  return text;
}

std::string qBlockHead(const std::string &comment, const std::string &name) {
  return functionHead(comment, name) + R"cuda(  const int blocks = params.size.padded_q / kBlockQ;
  const long long head = cta / blocks; // batch index * heads_q + Q head index
  const int block = (int)(cta % blocks);
  QBlock q;
)cuda";
}

const char *qCodesOfBlock = R"cuda(  unsigned char *codes =
      params.workspace + params.offsets.q_codes + (head * params.size.padded_q + (long long)block * kBlockQ) * kHeadDim;
)cuda";

// The cast that stands in for psi_Q or psi_K when the operand is not quantized (granularity none).
std::string castNote(const PrologueConfig &config) {
  return config.input == schedules::InputType::bf16 ? "rounded to bf16" : "rounded to f16";
}

std::string castQBlock(const PrologueConfig &config) {
  std::string comment = "// Launch 1: Q is not quantized: x " + castNote(config) +
                        " (round to nearest even) into q_codes [b, h_q, padded_q, d], 2 bytes\n// per value, "
                        "padded rows 0";
  comment += config.smooth_q ? " (and q_mean).\n" : ".\n";
  return qBlockHead(comment, "quantizeQBlock") +
         R"cuda(  unsigned short *values = (unsigned short *)(params.workspace + params.offsets.q_codes) +
                           (head * params.size.padded_q + (long long)block * kBlockQ) * kHeadDim;
  loadQBlock(q, params, head, block, shared, true);
  storeTileValues<QQuantizer>(q, values, kBlockQ);
}
)cuda";
}

std::string quantizeQBlock(const PrologueConfig &config) {
  if (config.q.cast())
    return castQBlock(config);
  if (config.q.microscaled()) {
    std::string comment = "// Launch 1: psi_Q (FP4) on one Q block: e2m1 codes into q_codes [b, h_q, padded_q, d / 2] "
                          "and\n// microscales into q_scales [b, h_q, padded_q, d / " +
                          std::to_string(config.q.groupChannels()) + "] (padded rows 0)";
    comment += config.smooth_q ? "; also the block's q_mean.\n" : ".\n";
    return qBlockHead(comment, "quantizeQBlock") +
           R"cuda(  const long long first_row = head * params.size.padded_q + (long long)block * kBlockQ;
  unsigned char *codes = params.workspace + params.offsets.q_codes + first_row * (kHeadDim / 2);
  unsigned char *scales =
      params.workspace + params.offsets.q_scales + first_row * (kHeadDim / QQuantizer::kGroupChannels);
  loadQBlock(q, params, head, block, shared, true);
  storeMicroscaledTile<QQuantizer>(q, codes, scales, kBlockQ);
}
)cuda";
  }
  if (config.q.perTensor())
    return qBlockHead(
               "// Launch 2: psi_Q with a per-tensor scale, on the second read of a Q block: the amax is the max of "
               "launch 1's\n// block amax (every block computes the same); block 0 stores scale = amax / qmax.\n",
               "quantizeQBlock") +
           qCodesOfBlock + R"cuda(  loadQBlock(q, params, head, block, shared, false);
  const float *block_amax = statisticsScratch(params).q_amax + head * blocks;
  float amax = 0.0f;
  for (int b = threadIdx.x; b < blocks; b += kThreads)
    amax = fmaxf(amax, block_amax[b]);
  amax = ctaMax(amax, (unsigned *)(shared + kTileGroupAmaxOffset));
  const SymmetricScale scale = symmetricScale(amax, QQuantizer::kCodeMax);
  if (block == 0 && threadIdx.x == 0)
    workspaceFloats(params, params.offsets.q_scales)[head] = scale.scale;
  storeTileCodes<QQuantizer>(q, codes, kBlockQ, [&](int) { return scale.inverse; });
}
)cuda";
  std::string comment =
      "// Launch 1: psi_Q on one Q block: q_codes [b, h_q, padded_q, d] (padded rows 0) and the block's "
      "q_scales";
  comment += config.smooth_q ? "\n// (and q_mean).\n" : ".\n";
  return qBlockHead(comment, "quantizeQBlock") + qCodesOfBlock +
         R"cuda(  loadQBlock(q, params, head, block, shared, true);
  float *scales = workspaceFloats(params, params.offsets.q_scales) + head * params.size.q_scale_count +
                  (long long)block * QQuantizer::kGroupsPerTile;
  quantizeTile<QQuantizer>(q, codes, scales, kBlockQ, QQuantizer::kGroupsPerTile, shared);
}
)cuda";
}

std::string measureQBlock(const PrologueConfig &config) {
  std::string comment =
      "// Launch 1, for the per-tensor psi_Q: the amax of one Q block's x, kept in prologue_statistics for "
      "launch 2\n// to combine";
  comment += config.smooth_q ? "; also the block's q_mean.\n" : ".\n";
  return qBlockHead(comment, "measureQBlock") + R"cuda(  loadQBlock(q, params, head, block, shared, true);
  const float amax = tileAmax<TokenTile<kBlockQ>>(q, (unsigned *)(shared + kTileGroupAmaxOffset));
  if (threadIdx.x == 0)
    statisticsScratch(params).q_amax[head * blocks + block] = amax;
}
)cuda";
}

std::string quantizeKTile(const PrologueConfig &config, bool after_statistics) {
  std::string comment = "// Launch " + std::string(after_statistics ? "2" : "1") + ": ";
  if (config.k.cast()) {
    comment += "K is not quantized: ";
    comment += config.smooth_k ? "gamma(K) = K - mean(K)" : "K";
    comment += " on kKBlocksPerTile KV blocks, " + castNote(config) +
               " (round to nearest\n// even) into k_codes [b, h_kv, padded_kv, d], 2 bytes per value, padded rows 0.\n";
  } else {
    comment += config.smooth_k ? "phi_K = psi_K o gamma" : "psi_K";
    comment += " on kKBlocksPerTile KV blocks: k_codes [b, h_kv, padded_kv, d] (padded rows 0)";
    comment += config.k.perTensor()
                   ? ";\n// the per-tensor scale's amax is combined from launch 1's slices, and tile 0 stores the "
                     "scale.\n"
                   : " and the\n// blocks' k_scales.\n";
  }
  if (config.smooth_q)
    comment += "// Q is smoothed: the tile also writes its tokens' delta_s (q_mean . x_K) for every Q block.\n";
  std::string text = functionHead(comment, "quantizeKTile");
  text += R"cuda(  const int tiles = (int)ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile);
  const long long head = cta / tiles; // batch index * heads_kv + KV head index
  const int first = (int)(cta % tiles) * kKTileTokens;
  const long long token_stride = params.k_strides.token;
  const int valid_rows = min(kKTileTokens, params.size.tokens_kv - first);
  const int stored_rows = min(kKTileTokens, params.size.padded_kv - first); // whole KV blocks
  KTile k;
  k.tile.load(headPointer(params.k, params.k_strides, head, params.size.heads_kv) + first * token_stride, token_stride,
              valid_rows);
)cuda";
  if (config.kStatistics())
    text += R"cuda(  // The statistics of the whole sequence, while this tile's loads are in flight.
  float *channel_mean = (float *)(shared + kTileMeansOffset);
  [[maybe_unused]] const float amax = combineKStatistics(params, head, first == 0, channel_mean,
                                                         (unsigned *)(shared + kTileGroupAmaxOffset));
)cuda";
  if (config.smooth_k)
    text += R"cuda(  k.valid_rows = valid_rows;
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    k.mean[j] = channel_mean[TokenTile<kKTileTokens>::channel() + j];
)cuda";
  if (config.smooth_q)
    text += "  writeQMeanCorrection(k, params, head, first, stored_rows);\n";
  if (config.k.cast())
    return text + (config.kStatistics() ? "" : "  (void)shared;\n") + R"cuda(  unsigned short *values =
      (unsigned short *)(params.workspace + params.offsets.k_codes) + (head * params.size.padded_kv + first) * kHeadDim;
  storeTileValues<KQuantizer>(k, values, stored_rows);
}
)cuda";
  if (config.k.microscaled())
    return text + R"cuda(  // FP4: e2m1 codes [b, h_kv, padded_kv, d / 2], microscales [b, h_kv, padded_kv, d / group]
  unsigned char *codes =
      params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * (kHeadDim / 2);
  unsigned char *scales = params.workspace + params.offsets.k_scales +
                          (head * params.size.padded_kv + first) * (kHeadDim / KQuantizer::kGroupChannels);
  storeMicroscaledTile<KQuantizer>(k, codes, scales, stored_rows);
}
)cuda";
  text += R"cuda(  unsigned char *codes =
      params.workspace + params.offsets.k_codes + (head * params.size.padded_kv + first) * kHeadDim;
)cuda";
  if (config.k.perTensor())
    text += R"cuda(  const SymmetricScale scale = symmetricScale(amax, KQuantizer::kCodeMax);
  if (first == 0 && threadIdx.x == 0)
    workspaceFloats(params, params.offsets.k_scales)[head] = scale.scale;
  storeTileCodes<KQuantizer>(k, codes, stored_rows, [&](int) { return scale.inverse; });
}
)cuda";
  else
    text +=
        R"cuda(  float *scales = workspaceFloats(params, params.offsets.k_scales) + head * params.size.k_scale_count +
                  (long long)(first / kBlockKv) * KQuantizer::kGroupsPerBlock;
  quantizeTile<KQuantizer>(k, codes, scales, stored_rows, stored_rows / kBlockKv * KQuantizer::kGroupsPerBlock, shared);
}
)cuda";
  return text;
}

std::string vTileHead(const std::string &comment, const std::string &name) {
  return functionHead(comment, name) + R"cuda(  const int tiles = vTiles(params.size);
  const long long head = cta / tiles; // batch index * heads_kv + KV head index
  const int tile = (int)(cta % tiles);
  const int first = tile * kVTileTokens;
  const int valid_rows = min(kVTileTokens, params.size.tokens_kv - first); // <= 0 in the padding
  const long long token_stride = params.v_strides.token;
  const unsigned short *v = headPointer(params.v, params.v_strides, head, params.size.heads_kv) + first * token_stride;
)cuda";
}

std::string convertVTile(const PrologueConfig &config) {
  std::string comment = "// Launch " + std::string(config.smooth_v ? "2" : "1") + ": V for an f16 P.V: ";
  comment += config.smooth_v ? "V - mean(V) (V smoothing, one f32 subtraction), " : "";
  comment += "rounded to f16 into\n// v_values [b, h_kv, padded_kv, d] (padded rows 0).\n";
  std::string text = vTileHead(comment, "convertVTile");
  text += R"cuda(  const int stored_rows = min(kVTileTokens, params.size.padded_kv - first);
  TokenTile<kVTileTokens> values;
  values.load(v, token_stride, valid_rows);
  const int channel = TokenTile<kVTileTokens>::channel();
)cuda";
  if (config.smooth_v)
    text += R"cuda(  float *channel_mean = (float *)shared;
  combineVStatistics(params, head, tile == 0, channel_mean, nullptr);
  float mean[kVectorElements];
#pragma unroll
  for (int j = 0; j < kVectorElements; ++j)
    mean[j] = channel_mean[channel + j];
)cuda";
  else
    text += "  (void)shared;\n";
  text += R"cuda(  unsigned short *out = (unsigned short *)(params.workspace + params.offsets.v_values) +
                       (head * params.size.padded_kv + first) * kHeadDim;
#pragma unroll
  for (int pass = 0; pass < TokenTile<kVTileTokens>::kPasses; ++pass) {
    const int row = TokenTile<kVTileTokens>::row(pass);
    if (!TokenTile<kVTileTokens>::inTile(pass) || row >= stored_rows)
      continue;
    unsigned words[4];
#pragma unroll
    for (int pair = 0; pair < 4; ++pair) {
      float x[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
)cuda";
  if (config.smooth_v)
    text += "        x[half] = row < valid_rows ? __fsub_rn(values.element(pass, j), mean[j]) : 0.0f;\n";
  else
    text += "        x[half] = values.element(pass, j);\n";
  text += R"cuda(      }
      words[pair] = (unsigned)floatToHalfBits(x[0]) | (unsigned)floatToHalfBits(x[1]) << 16;
    }
    *(uint4 *)(out + (long long)row * kHeadDim + channel) = uint4{words[0], words[1], words[2], words[3]};
  }
}
)cuda";
  return text;
}

// FP4 V: microscaled along its tokens (P.V's reduction axis) and transposed.
std::string quantizeFp4VTile(const PrologueConfig &config) {
  const int group = config.vGroupTokens();
  const bool mx = group == 32;
  std::string comment = "// Launch 1: psi_V (" + std::string(mx ? "MXFP4" : "NVFP4") +
                        ") on one V tile, along the tokens: e2m1 codes of V^T into v_codes [b, h_kv, d, padded_kv / "
                        "2]\n// (token 2t in the low nibble of byte t) and one " +
                        (mx ? "ue8m0" : "ue4m3") + " scale per " + std::to_string(group) +
                        " tokens of a channel into v_scales [b, h_kv, d,\n// padded_kv / " + std::to_string(group) +
                        "]; padded tokens are 0.\n";
  std::string text = vTileHead(comment, "quantizeVTile");
  text += "  constexpr int kGroupTokens = " + std::to_string(group) + ";\n";
  text += std::string("  const auto scale_code = [](float amax) { return sage::device::fp4::") +
          (mx ? "mxfp4_scale_code" : "nvfp4_scale_code") + "(amax); };\n";
  text += std::string("  const auto inverse_of = [](unsigned scale) { return sage::device::fp4::") +
          (mx ? "mxfp4_inverse" : "nvfp4_inverse") + "(scale); };\n";
  text += R"cuda(  (void)shared;
  const int stored_tokens = min(kVTileTokens, params.size.padded_kv - first);
  unsigned char *codes = params.workspace + params.offsets.v_codes;
  unsigned char *scales = params.workspace + params.offsets.v_scales;
  // A task is one channel x one group of tokens; neighbouring threads take neighbouring channels, so that each
  // token's loads are contiguous.
  for (int task = threadIdx.x; task < kHeadDim * (kVTileTokens / kGroupTokens); task += kThreads) {
    const int channel = task % kHeadDim, token = task / kHeadDim * kGroupTokens;
    if (token >= stored_tokens)
      break; // tasks only move on to later groups
    float x[kGroupTokens];
    float amax = 0.0f;
#pragma unroll
    for (int t = 0; t < kGroupTokens; ++t) {
      x[t] = token + t < valid_rows ? inputToFloat(v[(token + t) * token_stride + channel]) : 0.0f;
      amax = sage::device::fp4::max_magnitude(amax, x[t]);
    }
    const unsigned scale = scale_code(amax);
    const float inverse = inverse_of(scale);
    const long long row = head * kHeadDim + channel; // V^T's row
    unsigned *out = (unsigned *)(codes + row * (params.size.padded_kv / 2) + (first + token) / 2);
#pragma unroll
    for (int word = 0; word < kGroupTokens / 8; ++word) {
      float eight[8];
#pragma unroll
      for (int j = 0; j < 8; ++j)
        eight[j] = x[8 * word + j];
      out[word] = sage::device::fp4::pack_e2m1x8(eight, inverse);
    }
    scales[row * (params.size.padded_kv / kGroupTokens) + (first + token) / kGroupTokens] = (unsigned char)scale;
  }
}
)cuda";
  return text;
}

std::string quantizeVTile(const PrologueConfig &config) {
  if (config.v_output == VOutput::fp4_codes)
    return quantizeFp4VTile(config);
  std::string comment = "// Launch 2: per-channel psi_V on one V tile";
  comment += config.smooth_v ? " of V - mean(V)" : "";
  comment += ": codes transposed to v_codes [b, h_kv, d, padded_kv]\n// for the mma B operand (padded tokens get "
             "code 0); tile 0 also stores v_scales";
  comment += config.smooth_v ? " and v_mean.\n" : ".\n";
  std::string text = vTileHead(comment, "quantizeVTile");
  text += R"cuda(  float *channel_mean = (float *)shared;
  float *channel_inverse = channel_mean + kHeadDim;
  unsigned *transposed = (unsigned *)(shared + 2 * kHeadDim * 4); // [kHeadDim][kVTileWords], swizzled

  // A task is 4 consecutive tokens x 8 channels: the 4 codes of one channel pack into one word. The loads are
  // issued first, so that they are in flight while the statistics are combined.
  constexpr int kTasks = kVTileWords * kVectorsPerRow;
  constexpr int kTasksPerThread = (kTasks + kThreads - 1) / kThreads;
  uint4 raw[kTasksPerThread][4];
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int row = 4 * word + t;
      raw[i][t] = task < kTasks && row < valid_rows ? loadVector(v + row * token_stride + channel)
                                                    : uint4{0u, 0u, 0u, 0u};
    }
  }
  combineVStatistics(params, head, tile == 0, channel_mean, channel_inverse);
#pragma unroll
  for (int i = 0; i < kTasksPerThread; ++i) {
    const int task = i * kThreads + (int)threadIdx.x;
    if (task >= kTasks)
      break;
    const int channel = task % kVectorsPerRow * kVectorElements;
    const int word = task / kVectorsPerRow;
    unsigned packed[kVectorElements];
#pragma unroll
    for (int j = 0; j < kVectorElements; ++j) {
      const float inverse = channel_inverse[channel + j];
      packed[j] = 0u;
#pragma unroll
      for (int t = 0; t < 4; ++t) {
)cuda";
  if (config.smooth_v)
    text += R"cuda(        const float x =
            4 * word + t < valid_rows ? __fsub_rn(elementOf(raw[i][t], j), channel_mean[channel + j]) : 0.0f;
)cuda";
  else
    text += "        const float x = elementOf(raw[i][t], j);\n";
  text += R"cuda(        packed[j] |= vCode(__fmul_rn(x, inverse)) << (8 * t);
      }
      transposed[(channel + j) * kVTileWords + (word ^ vTileSwizzle(channel + j))] = packed[j];
    }
  }
  __syncthreads();

  // One warp per channel row: lanes store consecutive 4-token words (128-byte segments).
  const int stored_words = min(kVTileTokens, params.size.padded_kv - first) / 4;
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  unsigned char *codes = params.workspace + params.offsets.v_codes;
  for (int c = warp; c < kHeadDim; c += kThreads / 32) {
    unsigned *row = (unsigned *)(codes + (head * kHeadDim + c) * params.size.padded_kv + first);
    for (int w = lane; w < stored_words; w += 32)
      row[w] = transposed[c * kVTileWords + (w ^ vTileSwizzle(c))];
  }
}
)cuda";
  if (config.interleavedVCodes()) {
    // Word w packs positions 4w..4w+3 of the row, which hold the tokens vTokenAtPosition says.
    replaceOnce(text, "A task is 4 consecutive tokens x 8 channels", "A task is 4 consecutive positions x 8 channels");
    replaceOnce(text, "      const int row = 4 * word + t;\n",
                "      const int row = vTokenAtPosition(4 * word + t);\n");
    if (config.smooth_v)
      replaceOnce(text, "            4 * word + t < valid_rows ? ",
                  "            vTokenAtPosition(4 * word + t) < valid_rows ? ");
  }
  return text;
}

} // namespace

std::string emitRoleSupport(const PrologueConfig &config, const std::vector<PrologueRole> &roles) {
  std::string text;
  if (has(roles, PrologueRole::q_block_quantize) || has(roles, PrologueRole::q_block_statistics))
    text += qBlockSupport(config);
  if (has(roles, PrologueRole::k_block_quantize))
    text += kBlockSupport(config);
  if (has(roles, PrologueRole::k_block_quantize) && config.kStatistics())
    text += kStatisticsSupport(config);
  if (has(roles, PrologueRole::k_block_quantize) && config.smooth_q)
    text += qMeanCorrectionSupport();
  if ((has(roles, PrologueRole::q_block_quantize) && config.q.microscaled()) ||
      (has(roles, PrologueRole::k_block_quantize) && config.k.microscaled()))
    text += microscaledTileSupport();
  const bool v_quantize = has(roles, PrologueRole::v_tile_quantize) && config.v_output == VOutput::codes;
  if (v_quantize)
    text += vCodeSupport(config);
  if (v_quantize || (has(roles, PrologueRole::v_tile_convert) && config.smooth_v))
    text += vStatisticsSupport(config);
  return text;
}

std::string emitRoleFunction(PrologueRole role, const PrologueConfig &config) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return columnStatistics(config, true);
  case PrologueRole::v_column_statistics:
    return columnStatistics(config, false);
  case PrologueRole::q_block_statistics:
    return measureQBlock(config);
  case PrologueRole::q_block_quantize:
    return quantizeQBlock(config);
  case PrologueRole::k_block_quantize:
    return quantizeKTile(config, config.kAfterStatistics());
  case PrologueRole::v_tile_convert:
    return convertVTile(config);
  case PrologueRole::v_tile_quantize:
    return quantizeVTile(config);
  }
  throw std::logic_error("emitRoleFunction: unknown role");
}

std::string roleFunctionName(PrologueRole role, const PrologueConfig &) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return "reduceKColumns";
  case PrologueRole::v_column_statistics:
    return "reduceVColumns";
  case PrologueRole::q_block_statistics:
    return "measureQBlock";
  case PrologueRole::q_block_quantize:
    return "quantizeQBlock";
  case PrologueRole::k_block_quantize:
    return "quantizeKTile";
  case PrologueRole::v_tile_convert:
    return "convertVTile";
  case PrologueRole::v_tile_quantize:
    return "quantizeVTile";
  }
  throw std::logic_error("roleFunctionName: unknown role");
}

std::string roleCtaCountExpression(PrologueRole role) {
  switch (role) {
  case PrologueRole::k_column_statistics:
  case PrologueRole::v_column_statistics:
    return "kvHeads(params.size) * statisticsSlices(params.size)";
  case PrologueRole::q_block_statistics:
  case PrologueRole::q_block_quantize:
    return "qHeads(params.size) * (params.size.padded_q / kBlockQ)";
  case PrologueRole::k_block_quantize:
    return "kvHeads(params.size) * ceilDiv(params.size.padded_kv / kBlockKv, kKBlocksPerTile)";
  case PrologueRole::v_tile_convert:
  case PrologueRole::v_tile_quantize:
    return "kvHeads(params.size) * vTiles(params.size)";
  }
  throw std::logic_error("roleCtaCountExpression: unknown role");
}

std::string roleSummary(PrologueRole role, const PrologueConfig &config) {
  switch (role) {
  case PrologueRole::k_column_statistics:
    return "K column statistics per slice (batch * heads_kv * slices CTAs)";
  case PrologueRole::v_column_statistics:
    return "V column statistics per slice (batch * heads_kv * slices CTAs)";
  case PrologueRole::q_block_statistics:
    return "per-tensor psi_Q: amax of each Q block (batch * heads_q * ceil(tokens_q / b_q) CTAs)";
  case PrologueRole::q_block_quantize:
    return std::string(config.q.cast() ? "Q cast to the input type" : "psi_Q") +
           " per Q block (batch * heads_q * ceil(tokens_q / b_q) CTAs)";
  case PrologueRole::k_block_quantize:
    return std::string(config.k.cast()
                           ? (config.smooth_k ? "gamma(K) cast to the input type" : "K cast to the input type")
                       : config.smooth_k ? "phi_K = psi_K o gamma"
                                         : "psi_K") +
           " per " + std::to_string(config.tunables.k_blocks_per_tile) +
           " KV block(s) (batch * heads_kv * ceil(tokens_kv / (" + std::to_string(config.tunables.k_blocks_per_tile) +
           " * b_kv)) CTAs)";
  case PrologueRole::v_tile_convert:
    return std::string(config.smooth_v ? "V - mean(V)" : "V") +
           " to f16 per V tile (batch * heads_kv * ceil(padded_kv / " + std::to_string(config.tunables.v_tile_tokens) +
           ") CTAs)";
  case PrologueRole::v_tile_quantize:
    return std::string(config.v_output == VOutput::fp4_codes ? "FP4 psi_V along the tokens" : "per-channel psi_V") +
           " per V tile (batch * heads_kv * ceil(padded_kv / " + std::to_string(config.tunables.v_tile_tokens) +
           ") CTAs)";
  }
  throw std::logic_error("roleSummary: unknown role");
}

} // namespace sage::codegen::prologue
