// The parameter blocks of the generated kernels. This file is compiled by the host compiler AND
// pasted verbatim at the top of every generated kernel source (see kernelAbiSource()), so host and
// device agree on the layout by construction. Keep it plain C: no includes, no templates, fixed-size
// fields, pointers and 64-bit offsets only. Strides are in elements; offsets are in bytes from the
// workspace base and follow sage::schedules::WorkspaceLayout.
#ifndef SAGE_KERNEL_ABI_H
#define SAGE_KERNEL_ABI_H

struct SageWorkspaceOffsets {
  unsigned long long q_codes, q_scales, k_codes, k_scales, k_mean, q_mean;
  unsigned long long v_values, v_codes, v_scales, v_mean;
  unsigned long long delta_s; // Q smoothing's correction of S [b, h_q, q_blocks, padded_kv] (WorkspaceLayout.h)
};

struct SageTensorStrides {
  long long batch, head, token; // elements; the head-dim stride is 1
};

struct SageLseStrides {
  long long batch, head; // elements; the token stride is 1
};

struct SageProblemSize {
  int batch, heads_q, heads_kv, tokens_q, tokens_kv;
  int padded_q, padded_kv;          // tokens rounded up to the block sizes
  int q_scale_count, k_scale_count; // scales per (batch, head)
};

// Variable-length batches (KernelPlan::packed_sequences; both pointers 0 for dense kernels). Sequence b of Q is rows
// q[b] .. q[b + 1] - 1 of the caller's packed Q, O and LSE ([total_q, heads, d], batch stride 0), and of K/V by kv[].
// SageProblemSize then holds batch = the number of sequences and tokens_q / tokens_kv = the call's maximum lengths
// (the workspace's dense layout; a sequence's tokens past its length are written as zero codes). Kernels clamp what
// they read to [0, total_q) / [0, total_kv) and a length to the maximum, so wrong offsets never touch memory outside
// the tensors (the front doors check them where they can).
struct SageSequenceOffsets {
  const int *q;  // cu_seqlens_q, int32 [batch + 1], device memory
  const int *kv; // cu_seqlens_kv, int32 [batch + 1]
  int total_q, total_kv;
};

#define SAGE_NO_CLEARED_WORD 0xffffffffffffffffull

// Quantization prologue: reads Q, K, V once and fills the workspace.
struct SagePrologueParams {
  const void *q, *k, *v; // f16 or bf16, as the kernel was generated for
  struct SageTensorStrides q_strides, k_strides, v_strides;
  struct SageProblemSize size;
  struct SageSequenceOffsets sequences; // packed variants only (all 0 otherwise)
  float q_prescale;                     // multiplies Q before quantization: 1/sqrt(d) * log2(e) when folded, else 1
  unsigned char *workspace;
  struct SageWorkspaceOffsets offsets;
  unsigned long long statistics_offset; // the prologue's own scratch (WorkspaceLayout::prologue_statistics)
  unsigned long long counters_offset;   // the one-pass prologue's counters (WorkspaceLayout::prologue_counters)
  // A 4-byte word of the workspace that thread 0 of CTA 0 zeroes in every launch, or SAGE_NO_CLEARED_WORD: the
  // persistent sm90 kernel's tile counter, cleared by the prologue that precedes it instead of by a memset of its
  // own (one driver call less per call).
  unsigned long long cleared_word_offset;
};

// Attention main loop: reads the workspace (and V directly when it needs no conversion).
struct SageAttentionParams {
  const unsigned char *workspace;
  struct SageWorkspaceOffsets offsets;
  const void *q; // the caller's Q, read by the LSE's K-smoothing correction (q . mean(K)), else unused
  struct SageTensorStrides q_strides;
  const void *v; // the caller's V, used when the variant reads f16 V in place
  struct SageTensorStrides v_strides;
  void *o; // output, same dtype as the input
  struct SageTensorStrides o_strides;
  // Natural-log LSE, or 0: element (b, h, t) at lse[b * lse_strides.batch + h * lse_strides.head + t]; dense
  // [b, h_q, tokens_q]: {h_q tokens_q, tokens_q}; packed [h_q, total_q]: {0, total_q}.
  float *lse;
  struct SageLseStrides lse_strides;
  const unsigned char *block_mask; // [b, h_q, q_blocks, kv_blocks] (1 = compute), or 0
  struct SageProblemSize size;
  float softmax_scale; // 1/sqrt(d): for the LSE and for unfolded variants
  // Causal: query row i sees key j iff j <= i + causal_offset. tokens_kv - tokens_q aligns the mask bottom-right
  // (FlashAttention); 0 aligns it top-left (PyTorch SDPA's is_causal). Unused without a causal mask.
  int causal_offset;
  // Packed variants: t above is the sequence's first row plus its token, and the mask's offset is per sequence:
  // causal_offset + (length_kv - length_q) when causal_bottom_right, else causal_offset (0: top-left).
  struct SageSequenceOffsets sequences;
  int causal_bottom_right;
};

// The sm90 (TMA) kernels: a CUtensorMap per operand, encoded by the runtime with cuTensorMapEncodeTiled for this
// call's workspace and tensors, read by the copy engine straight from the kernel's __grid_constant__ parameters.
// Opaque here (128 bytes, 64-byte aligned, as cuda.h defines CUtensorMap), so this file needs no CUDA header.
struct __attribute__((aligned(64))) SageTensorMap {
  unsigned long long opaque[16];
};

struct SageSm90AttentionParams {
  struct SageTensorMap q_map; // q_codes [b * h_q * padded_q rows][d * bytes]
  struct SageTensorMap k_map; // k_codes [b * h_kv * padded_kv rows][d * bytes]
  struct SageTensorMap v_map; // v_codes [b * h_kv * d rows][padded_kv], v_values, or the caller's V (4-d)
  struct SageAttentionParams base;
  // A persistent kernel's tile counter (WorkspaceLayout::attention_counters), zero when the launch starts; 0 for
  // the others.
  unsigned *tile_counter;
};

#endif // SAGE_KERNEL_ABI_H
