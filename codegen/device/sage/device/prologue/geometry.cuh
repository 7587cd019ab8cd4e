// The quantization prologue's grid geometry: how many CTAs each role has, from the problem size. Mirrored by
// sage::codegen::prologueRoleCtas on the host: change both together. The prologue generator pastes this header after
// KernelAbi.h (SageProblemSize) and its constants (kStatisticsCtasPerTensor, kStatisticsMinSliceTokens,
// kMaxStatisticsSlices, kVTileTokens), whose names it uses.
#pragma once

namespace sage::device::prologue {

__device__ __forceinline__ long long ceilDiv(long long value, long long divisor) {
  return (value + divisor - 1) / divisor;
}
__device__ __forceinline__ long long qHeads(const SageProblemSize &size) {
  return (long long)size.batch * size.heads_q;
}
__device__ __forceinline__ long long kvHeads(const SageProblemSize &size) {
  return (long long)size.batch * size.heads_kv;
}
// Column statistics split each KV head's tokens into slices: enough for kStatisticsCtasPerTensor CTAs over all
// heads, each of at least kStatisticsMinSliceTokens tokens, at most kMaxStatisticsSlices.
__device__ __forceinline__ int statisticsSlices(const SageProblemSize &size) {
  const long long for_parallelism = ceilDiv(kStatisticsCtasPerTensor, kvHeads(size));
  const long long for_length = ceilDiv(size.tokens_kv, kStatisticsMinSliceTokens);
  const long long slices = for_parallelism < for_length ? for_parallelism : for_length;
  return (int)(slices < kMaxStatisticsSlices ? slices : kMaxStatisticsSlices);
}
// Tokens of one slice of a sequence of `length` tokens (a packed slot's own length: its slices share its tokens).
__device__ __forceinline__ int statisticsSliceTokens(int length, int slices) { return (int)ceilDiv(length, slices); }
__device__ __forceinline__ int vTiles(const SageProblemSize &size) {
  return (int)ceilDiv(size.padded_kv, kVTileTokens);
}

} // namespace sage::device::prologue
