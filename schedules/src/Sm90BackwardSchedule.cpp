// The sm90 wgmma backward schedule: what it supports and its launches (the main kernel is
// codegen/device/sage/device/sm90/backward.cuh; the preprocess and write_dq kernels are the mma.sync schedule's).
#include "sage/schedules/BackwardSchedule.h"

#include <stdexcept>

namespace sage::schedules {
namespace {

constexpr int kBlock = 64, kKeys = 128;

int align1024(int bytes) { return (bytes + 1023) / 1024 * 1024; }

// backward.cuh's MainLayout, byte for byte (the generated source static_asserts that both agree): K^ [128][d], two
// K^^T [d][64] tiles, V [128][d] 16-bit; two stages of Q^ [64][d], dO [64][d] 16-bit, Q^^T and dO^^T [d][64] and 64
// row stats; the dS codes [64][128]; the dQ tile [64][d] f32; with per-query dS scales (query_scales) 2 x 4 warps x
// 64 |dS| maxima and 2 x 64 scales; 18 floats of scratch (80 bytes) and two mbarriers; every tile 1024-byte aligned,
// plus 1024 bytes for aligning the dynamic buffer.
int mainSharedBytes(int head_dim, bool query_scales) {
  const int d = head_dim;
  const int v = align1024(align1024(kKeys * d) + 2 * d * kBlock);
  const int stages = align1024(v + kKeys * 2 * d);
  const int stats = align1024(align1024(align1024(align1024(kBlock * d) + kBlock * 2 * d) + d * kBlock) + d * kBlock);
  const int stage = align1024(stats + kBlock * 2 * 4);
  const int query_maxima = align1024(stages + 2 * stage + kBlock * kKeys) + kBlock * d * 4;
  const int scratch = align1024(query_maxima + (query_scales ? (2 * 4 + 2) * kBlock * 4 : 0));
  return scratch + 80 + 2 * 8 + 1024;
}

} // namespace

std::string_view Sm90BackwardSchedule::summary() const {
  return "SageBwd on wgmma (sm_90a): per CTA 128 keys, one 64-key K block per warpgroup; S^T, dP^T and dQ from shared "
         "memory, dV and dK with the P/dS codes as register A operands (one int8 scale per 64x64 tile, or per key for "
         "dV and dK: plan.key_scales, per query for dQ: plan.query_scales); K and V by cp.async, each Q tile's "
         "operands by bulk copies of tiles the "
         "preprocess wrote in shared-memory order (two stages, mbarriers); dQ by one bulk f32 reduction per tile from "
         "shared memory";
}

SupportResult Sm90BackwardSchedule::supports(const BackwardVariant &variant, GpuArch arch, InputType input) const {
  if (!hasWgmma(arch))
    return SupportResult::no(std::string(archName(arch)) + " has no wgmma (the sm90 backward needs sm_90a)");
  // The same quantizers and products as the mma.sync schedule (per-tile, per-key or per-query P/dS scales): its verdict
  // on what is computed holds.
  return Sm80BackwardSchedule().supports(variant, arch, input);
}

BackwardKernelPlan Sm90BackwardSchedule::plan(const BackwardVariant &variant, GpuArch arch, InputType input) const {
  if (const SupportResult support = supports(variant, arch, input); !support)
    throw std::invalid_argument("backward variant '" + variant.name + "': " + support.reason);
  const bool query_scales = variant.product(BackwardProduct::dq).lhs.granularity == Granularity::per_token;
  BackwardKernelPlan plan =
      sageBwdPlan(name(), variant, arch, input, kKeys, 8, mainSharedBytes(variant.head_dim, query_scales));
  plan.bulk_tiles = true;
  return plan;
}

} // namespace sage::schedules
