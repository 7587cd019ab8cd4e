#include "sage/schedules/BackwardSchedule.h"
#include "sage/schedules/GpuLimits.h"

#include <algorithm>
#include <stdexcept>

namespace sage::schedules {
namespace {

constexpr int kBlock = 64;
// K smoothing: at most this many slices of a KV head's tokens are summed by separate CTAs; each preprocess CTA then
// adds the slices' sums (kKMeanSlices x d floats from L2: 4 KB at d = 128 against the 16 KB of K it quantizes).
constexpr int kKMeanSlices = 8;

// The main kernel's shared memory for `keys` keys per CTA (backward.cuh's kMainSharedBytes): every row padded by 16
// bytes (no bank conflicts for ldmatrix): K^ [keys][d] and Q^ [64][d] int8, K^^T (one [d][64] tile per K block),
// Q^^T, dO^^T as [d][64] int8, V [keys][d] and dO [64][d] 16-bit, the P^T and dS^T codes [keys][64], the dS codes
// [64][keys], 2 x 64 row statistics and 2 x 2 x keys / 16 floats of reduction scratch; with per-query dS scales
// (query_scales) each warp's |dS| maxima of the 64 queries.
int mainSharedBytes(int head_dim, int keys, bool query_scales) {
  constexpr int kPad = 16;
  return (keys + kBlock) * (head_dim + kPad) + (keys / kBlock + 2) * head_dim * (kBlock + kPad) +
         (keys + kBlock) * (2 * head_dim + kPad) + 2 * keys * (kBlock + kPad) + kBlock * (keys + kPad) +
         (2 * kBlock + 4 * (keys / 16) + (query_scales ? kBlock * (keys / 16) : 0)) * 4;
}

// Whether `spec` is int8 with one scale per `group_tokens` tokens, rotated or not (the rotation is checked apart).
bool isInt8PerBlock(QuantizerSpec spec, int group_tokens) {
  spec.rotation_seed = std::nullopt;
  return spec == QuantizerSpec{ElementType::int8, Granularity::per_block, group_tokens};
}

int64_t blocksOf(int64_t tokens, int64_t tile = kBlock) { return (tokens + tile - 1) / tile; }

} // namespace

std::array<int64_t, 3> BackwardLaunch::gridFor(int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t tokens_q,
                                               int64_t tokens_kv) const {
  switch (grid) {
  case BackwardGrid::q_blocks:
    return {blocksOf(tokens_q, tile_tokens), heads_q, batch};
  case BackwardGrid::kv_blocks:
    return {blocksOf(tokens_kv, tile_tokens), heads_kv, batch};
  case BackwardGrid::kv_slices:
    break;
  }
  return {std::min<int64_t>(slices, blocksOf(tokens_kv)), heads_kv, batch};
}

std::string BackwardKernelPlan::describe() const {
  return schedule + " " + std::string(archName(arch)) + " " + std::string(nameOf(input)) + " d" +
         std::to_string(head_dim) + (causal ? " causal" : "") + " tiles " + std::to_string(block_q) + "x" +
         std::to_string(block_kv) + " (" + std::to_string(kv_tile) + " keys per CTA) warps " + std::to_string(warps) +
         (smooth_k ? " smooth-k" : "") + (rotation_seed ? " rotated" : "") + (key_scales ? " key-scales" : "") +
         (query_scales ? " query-scales" : "") + " launches " + std::to_string(launches.size());
}

BackwardWorkspaceSizes backwardWorkspaceSizes(const BackwardKernelPlan &plan, int64_t batch, int64_t heads_q,
                                              int64_t heads_kv, int64_t tokens_q, int64_t tokens_kv) {
  BackwardWorkspaceSizes sizes;
  const int64_t d = plan.head_dim;
  sizes.q_codes = batch * heads_q * blocksOf(tokens_q) * kBlock * d;
  sizes.do_codes = sizes.q_codes;
  sizes.k_codes = batch * heads_kv * blocksOf(tokens_kv) * kBlock * d;
  sizes.q_scales = 4 * batch * heads_q * blocksOf(tokens_q);
  sizes.do_scales = sizes.q_scales;
  sizes.k_scales = 4 * batch * heads_kv * blocksOf(tokens_kv);
  // Whole 64-row blocks, so that the main kernel reads and sums rows beyond tokens_q without a bounds check.
  const int64_t padded_q_rows = batch * heads_q * blocksOf(tokens_q) * kBlock;
  sizes.row_stats = 2 * 4 * padded_q_rows;
  sizes.dq_accum = 4 * padded_q_rows * d;
  sizes.do_tiles = plan.bulk_tiles ? 2 * padded_q_rows * d : 0;
  for (const BackwardLaunch &launch : plan.launches)
    if (launch.grid == BackwardGrid::kv_slices)
      sizes.k_sums = 4 * batch * heads_kv * std::min<int64_t>(launch.slices, blocksOf(tokens_kv)) * d;
  return sizes;
}

std::string_view Sm80BackwardSchedule::summary() const {
  return "SageBwd on mma.sync: int8 m16n8k32 for S, dV, dK, dQ and f16/bf16 m16n8k16 for dO.V^T; one CTA per KV "
         "tile of 128 keys (64 where shared memory is short) and KV head (GQA group summed in registers), dQ by f32 "
         "atomics; one int8 scale per 64x64 P/dS tile (per key for dV and dK: plan.key_scales; per query for dQ: "
         "plan.query_scales), a warp per 16 keys; K smoothed by the preprocess (mean(K) from per-slice column sums, "
         "the LSE shifted per query row)";
}

SupportResult Sm80BackwardSchedule::supports(const BackwardVariant &variant, GpuArch arch, InputType input) const {
  using P = BackwardProduct;
  if (!hasInt8MmaSync(arch))
    return SupportResult::no(std::string(archName(arch)) + " has no int8 mma.sync");
  if (variant.head_dim != 64 && variant.head_dim != 128)
    return SupportResult::no("head_dim " + std::to_string(variant.head_dim) + ": the backward kernel has 64 and 128");
  if (variant.block_q != kBlock || variant.block_kv != kBlock)
    return SupportResult::no("tiles " + std::to_string(variant.block_q) + "x" + std::to_string(variant.block_kv) +
                             ": the backward kernel uses 64x64 (b_q = b_kv = 64)");
  if (variant.mask != MaskKind::none && variant.mask != MaskKind::causal)
    return SupportResult::no("mask '" + std::string(nameOf(variant.mask)) + "': the backward has none and causal");
  if (variant.smooth_k == SmoothScope::block)
    return SupportResult::no("K smoothed per block: the kernels subtract one mean(K) per KV head (sequence)");
  const BackwardProductSpec &s = variant.product(P::s), &dp = variant.product(P::dp), &dv = variant.product(P::dv);
  const BackwardProductSpec &dq = variant.product(P::dq), &dk = variant.product(P::dk);
  const ElementType input_type = input == InputType::bf16 ? ElementType::bf16 : ElementType::f16;
  if (!isInt8PerBlock(s.lhs, kBlock) || !isInt8PerBlock(s.rhs, kBlock))
    return SupportResult::no("S = Q.K^T: the kernel quantizes Q and K to int8 per 64-token block");
  if (dp.lhs != QuantizerSpec{input_type} || dp.rhs != QuantizerSpec{input_type})
    return SupportResult::no(
        "dP = dO.V^T: the kernel multiplies dO and V in the input type (" + std::string(nameOf(input)) +
        "); an int8 dO.V^T (Table 1(c)'s ablation) or another cast runs on the CPU reference only");
  const QuantizerSpec per_token{ElementType::int8, Granularity::per_token, 0};
  if ((!isInt8PerBlock(dv.lhs, 0) && dv.lhs != per_token) || !isInt8PerBlock(dv.rhs, kBlock) || dk.lhs != dv.lhs ||
      (!isInt8PerBlock(dq.lhs, 0) && dq.lhs != per_token))
    return SupportResult::no("dV, dQ, dK: the kernel takes int8 P and dS with one scale per tile or per token of the "
                             "product's output (per_token: per key for dV and dK both, per query for dQ), and int8 "
                             "dO per 64-token block");
  if (dq.rhs != s.rhs || dk.rhs != s.lhs)
    return SupportResult::no("dQ = dS.K and dK = dS^T.Q reuse the codes of S's K and Q in the kernel");
  if (s.lhs.rotation_seed != s.rhs.rotation_seed)
    return SupportResult::no("S = Q.K^T: the kernel rotates Q and K with one seed, or neither");
  return SupportResult::yes();
}

BackwardKernelPlan sageBwdPlan(std::string_view schedule, const BackwardVariant &variant, GpuArch arch, InputType input,
                               int keys, int warps, int main_shared_bytes) {
  if (main_shared_bytes > gpuLimits(arch).max_dynamic_shared_bytes_per_block)
    throw std::invalid_argument("backward variant '" + variant.name + "': " + std::to_string(main_shared_bytes) +
                                " bytes of shared memory exceed " + std::string(archName(arch)) + "'s limit");
  BackwardKernelPlan plan;
  plan.schedule = std::string(schedule);
  plan.arch = arch;
  plan.input = input;
  plan.head_dim = variant.head_dim;
  plan.causal = variant.mask == MaskKind::causal;
  plan.kv_tile = keys;
  plan.warps = warps;
  plan.smooth_k = variant.smooth_k != SmoothScope::none;
  plan.rotation_seed = variant.product(BackwardProduct::s).lhs.rotation_seed;
  plan.key_scales = variant.product(BackwardProduct::dv).lhs.granularity == Granularity::per_token;
  plan.query_scales = variant.product(BackwardProduct::dq).lhs.granularity == Granularity::per_token;
  if (plan.smooth_k) // mean(K) before the preprocess kernels, which both use it
    plan.launches.push_back({"sage_bwd_k_sums", BackwardGrid::kv_slices, 0, 128, kBlock, kKMeanSlices});
  plan.launches.push_back({"sage_bwd_preprocess_q", BackwardGrid::q_blocks, 0});
  plan.launches.push_back({"sage_bwd_preprocess_k", BackwardGrid::kv_blocks, 0});
  plan.launches.push_back({"sage_bwd_main", BackwardGrid::kv_blocks, main_shared_bytes, 32 * warps, keys});
  plan.launches.push_back({"sage_bwd_write_dq", BackwardGrid::q_blocks, 0});
  return plan;
}

BackwardKernelPlan Sm80BackwardSchedule::plan(const BackwardVariant &variant, GpuArch arch, InputType input) const {
  if (const SupportResult support = supports(variant, arch, input); !support)
    throw std::invalid_argument("backward variant '" + variant.name + "': " + support.reason);
  // Two K blocks per CTA where shared memory allows (sm_80, sm_90, sm_100: 148 KB at d = 128): each Q tile's loads
  // and dQ reductions then serve 128 keys instead of 64, which halves the L2 traffic that limited the 64-key kernel
  // (ncu, H100: L2 69% busy, the tensor pipes below 20%). sm_86/89/120 (99 KB per block) keep one.
  const int limit = gpuLimits(arch).max_dynamic_shared_bytes_per_block;
  const bool query_scales = variant.product(BackwardProduct::dq).lhs.granularity == Granularity::per_token;
  const int keys = mainSharedBytes(variant.head_dim, 2 * kBlock, query_scales) <= limit ? 2 * kBlock : kBlock;
  return sageBwdPlan(name(), variant, arch, input, keys, keys / 16,
                     mainSharedBytes(variant.head_dim, keys, query_scales));
}

const std::vector<const BackwardSchedule *> &allBackwardSchedules() {
  static const Sm90BackwardSchedule sm90;
  static const Sm80BackwardSchedule sm80;
  static const std::vector<const BackwardSchedule *> list = {&sm90, &sm80};
  return list;
}

const BackwardSchedule &bestBackwardSchedule(const BackwardVariant &variant, GpuArch arch, InputType input) {
  std::string reasons;
  for (const BackwardSchedule *schedule : allBackwardSchedules()) {
    const SupportResult support = schedule->supports(variant, arch, input);
    if (support)
      return *schedule;
    reasons += "; " + std::string(schedule->name()) + ": " + support.reason;
  }
  throw std::invalid_argument("backward variant '" + variant.name + "': no schedule supports it on " +
                              std::string(archName(arch)) + reasons);
}

} // namespace sage::schedules
