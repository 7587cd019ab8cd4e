// The parameters of the SageBwd kernels (issue 12), one struct passed by value to each launch (four, five with K
// smoothing). Plain data with no device code, so host code can include it too (the runtime's launcher and the GPU
// tests).
#pragma once

// Tensors are contiguous [batch, heads, tokens, head_dim] (HND); Q, O, dO, dQ have heads_q heads and tokens_q
// tokens, K, V, dK, dV heads_kv heads and tokens_kv tokens. Elements are f16 or bf16 (the kernel's Config).
// The workspace holds whole 64-token blocks (tokens rounded up, zero codes beyond the end):
//   q_codes, k_codes:          int8 [batch, heads, blocks * 64, head_dim]       (S = Q.K^T)
//   q_codes_t, k_codes_t:      int8 [batch, heads, blocks, head_dim, 64]        (dK = dS^T.Q, dQ = dS.K: the
//   do_codes_t:                int8 [batch, heads_q, blocks, head_dim, 64]       token axis is the reduction axis)
//   q_scales, k_scales, do_scales: f32 [batch, heads, blocks]
//   row_stats: f32 [batch, heads_q, blocks * 64, 2]: {L log2(e), D = rowsum(dO o O)} per query row; L log2(e) is
//              +inf where the row has no visible key (L = -inf) and beyond tokens_q, so exp2(S log2(e) - it) is 0
//   dq_accum: f32 [batch, heads_q, blocks * 64, head_dim], zeroed by the preprocess, summed into by atomics
//   do_tiles: 16-bit [batch, heads_q, blocks, 64 x head_dim], a copy of dO (wgmma schedule only, else null)
//   k_sums: f32 [batch, heads_kv, slices, head_dim], K's column sums over each slice of its tokens (K smoothing only,
//           else null; slices = min(Config::kKMeanSlices, 64-token blocks of K), each a run of whole blocks)
// With K smoothing (Config::kSmoothK) the K codes are of K - mean(K) per KV head, and L log2(e) is that of the shifted
// LSE, (LSE - q . mean(K) / sqrt(d)) log2(e): the main kernels need no change.
// The wgmma schedule's preprocess writes each 64-token block of q_codes, q_codes_t, do_codes_t and do_tiles in the
// byte order of the main kernel's swizzled shared-memory tile (sm80/backward_prepare.cuh's BulkTiles), so that the
// main kernel loads each with one bulk copy.
struct SageBackwardParams {
  const void *q, *k, *v, *o, *d_o;
  const float *lse; // [batch, heads_q, tokens_q], natural log; -inf for a fully masked row
  void *d_q, *d_k, *d_v;
  signed char *q_codes, *q_codes_t, *k_codes, *k_codes_t, *do_codes_t;
  float *q_scales, *k_scales, *do_scales;
  float *row_stats, *dq_accum;
  unsigned short *do_tiles;
  float *k_sums;
  int batch, heads_q, heads_kv, tokens_q, tokens_kv;
  float softmax_scale; // 1 / sqrt(head_dim)
};
