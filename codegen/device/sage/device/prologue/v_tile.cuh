// The V tile that one CTA of a V role of the quantization prologue handles. The prologue generator pastes this header
// after KernelAbi.h, its constants (kVTileTokens), geometry.cuh and sequences.cuh, whose names it uses.
#pragma once

namespace sage::device::prologue {

// V tiles are kVTileTokens tokens of one KV head, head-major over the CTAs of the role.
struct VTileTask {
  long long head;          // batch index * heads_kv + KV head index
  int tile;                // of the head
  int first;               // its first token
  int length;              // the head's tokens (its slot's sequence)
  int valid_rows;          // its tokens inside the sequence (<= 0 in the padding, or past a packed sequence)
  long long token_stride;  // of the caller's V
  const unsigned short *v; // its first token in the caller's V
};

__device__ __forceinline__ VTileTask vTileTask(const SagePrologueParams &params, long long cta) {
  const int tiles = vTiles(params.size);
  VTileTask task;
  task.head = cta / tiles;
  task.tile = (int)(cta % tiles);
  task.first = task.tile * kVTileTokens;
  const SequenceRows rows = valueRows(params, task.head);
  task.length = rows.length;
  task.valid_rows = min(kVTileTokens, rows.length - task.first);
  task.token_stride = rows.token_stride;
  task.v = rows.rows + task.first * task.token_stride;
  return task;
}

} // namespace sage::device::prologue
