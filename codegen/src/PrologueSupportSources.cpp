// The device helpers the prologue's role functions call (tile loads, statistics, Q smoothing's GEMV, FP4 tiles,
// V codes), emitted only for the roles a kernel has (PrologueRoleSources.cpp emits the role functions themselves).
// The K tile, Q smoothing's GEMV and the FP4 tiles are the device library's (sage/device/prologue/*.cuh), pasted.
#include "sage/codegen/DeviceLibrary.h"
#include "sage/codegen/PrologueDeviceCode.h"

#include <algorithm>
#include <string>

namespace sage::codegen::prologue {
namespace {

bool has(const std::vector<PrologueRole> &roles, PrologueRole role) {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
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

// kKBlocksPerTile KV blocks of K in registers, and the x that psi_K quantizes (K, or gamma(K) when K is smoothed).
std::string kBlockSupport(const PrologueConfig &config) {
  return pasteDeviceHeader("sage/device/prologue/k_tile.cuh") + "using KTile = sage::device::prologue::KTileOf<" +
         (config.smooth_k ? "true" : "false") + ">; // " + (config.smooth_k ? "gamma(K) = K - mean(K)" : "K itself") +
         "\n";
}

// Q smoothing's correction, written by the K tiles (launch 2, after launch 1's q_mean): the GEMV of
// sage.q_mean_correction.
std::string qMeanCorrectionSupport() {
  return pasteDeviceHeader("sage/device/prologue/q_mean_correction.cuh") +
         "using sage::device::prologue::writeQMeanCorrection;\n";
}

// Microscaled (FP4) Q and K: the codes and scales of a tile's rows.
std::string microscaledTileSupport() {
  return pasteDeviceHeader("sage/device/prologue/microscaled_tile.cuh") +
         "using sage::device::prologue::storeMicroscaledTile;\n";
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

} // namespace sage::codegen::prologue
