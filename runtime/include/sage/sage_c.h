/* The C ABI of sagegen, version 2: build an attention kernel from a preset or textual IR for one CUDA device, and
 * run it on tensors described in full (data pointer, shape, strides, dtype, device). Usable from any language (the
 * Python package uses it through ctypes, without building against PyTorch).
 *
 * Every tensor is validated against the kernel before anything is launched: head dim, dtypes, batch / heads /
 * tokens agreement, GQA divisibility, the alignment the kernels need, output shapes, devices and the limits of the
 * launch grid. Nothing a call writes (o, lse, d_q, d_k, d_v, the workspace) may share a byte with another argument;
 * inputs may alias one another. Every call returns a sage_status chosen by the kind of failure; on failure
 * sage_last_error() returns this thread's message, which names the argument and what was expected. No exception
 * crosses this boundary.
 *
 * Version 1 (sage_attention_run with bare pointers and a shape without head dim) is gone: it could not be made safe.
 * Version 3 added sage_sla_config.dtype (bf16 SLA) at the end of that struct; sage_merge_c.h's
 * sage_merge_attention came later within version 3 (a new function, no struct changed: look the symbol up), and so
 * did the variable-length calls (sage_attention_run_varlen, sage_attention_varlen_workspace_bytes, SAGE_DTYPE_I32).
 * Strides are in elements. */
#ifndef SAGE_C_H
#define SAGE_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SAGE_ABI_VERSION 3

typedef enum sage_status {
  SAGE_OK = 0,
  SAGE_INVALID_ARGUMENT = 1, /* the caller's mistake: see sage_last_error() */
  SAGE_UNSUPPORTED = 2,      /* valid, but no schedule supports it on this GPU (the message says why) */
  SAGE_COMPILE_ERROR = 3,    /* NVRTC failed: the message has the kernel key and the log */
  SAGE_CUDA_ERROR = 4,       /* the driver failed (or there is no driver / device) */
  SAGE_INTERNAL_ERROR = 5,   /* a bug in sagegen: please report the message */
  SAGE_OUT_OF_MEMORY = 6     /* host memory ran out */
} sage_status;

typedef enum sage_dtype {
  SAGE_DTYPE_F16 = 1,
  SAGE_DTYPE_BF16 = 2,
  SAGE_DTYPE_F32 = 3,
  SAGE_DTYPE_U8 = 4,
  SAGE_DTYPE_BOOL = 5, /* one byte per element, 0 or 1 */
  SAGE_DTYPE_I32 = 6   /* cu_seqlens of a variable-length call */
} sage_dtype;

typedef enum sage_layout {
  SAGE_LAYOUT_HND = 0, /* q/k/v/o: [batch, heads, tokens, head_dim] */
  SAGE_LAYOUT_NHD = 1  /* q/k/v/o: [batch, tokens, heads, head_dim] */
} sage_layout;

/* Causal masks with tokens_q != tokens_kv. BOTTOM_RIGHT (FlashAttention): query i sees key j iff
 * j <= i + tokens_kv - tokens_q. TOP_LEFT (PyTorch SDPA's is_causal, SageAttention's sageattn): iff j <= i. */
typedef enum sage_causal_alignment { SAGE_CAUSAL_BOTTOM_RIGHT = 0, SAGE_CAUSAL_TOP_LEFT = 1 } sage_causal_alignment;

typedef enum sage_phase {
  SAGE_PHASE_ALL = 0,      /* prologue then attention */
  SAGE_PHASE_PROLOGUE = 1, /* quantization only (fills the workspace) */
  SAGE_PHASE_ATTENTION = 2 /* attention only (reads a workspace the prologue filled) */
} sage_phase;

#define SAGE_HOST_MEMORY (-1) /* sage_tensor_desc.device of host memory (always rejected) */

typedef struct sage_tensor_desc {
  void *data;
  int ndim;             /* 4 for q/k/v/o/block_mask, 3 for lse */
  long long shape[4];   /* the first ndim entries */
  long long strides[4]; /* in elements */
  sage_dtype dtype;
  int device; /* CUDA device ordinal, or SAGE_HOST_MEMORY */
} sage_tensor_desc;

typedef struct sage_attention *sage_attention_t;

typedef struct sage_attention_config {
  const char *preset;  /* a preset name ("sage-b", ...), or NULL when ir_text is given */
  const char *ir_text; /* textual sage IR, or NULL (then head_dim/causal/write_lse apply to the preset) */
  int head_dim;        /* 32..256 in steps of 16 (SAGE_UNSUPPORTED, with the reason, where no schedule runs it) */
  int causal;
  int write_lse;
  sage_dtype dtype;     /* SAGE_DTYPE_F16 or SAGE_DTYPE_BF16: the storage type of q, k, v and o */
  const char *tunables; /* "warps=4,stages=3" (fields left out keep the device arch's defaults); NULL or "" */
  int device;           /* the CUDA device the kernels are loaded on; every tensor must be on it */
} sage_attention_config;

typedef struct sage_run_args {
  sage_layout layout;
  sage_phase phase;
  sage_causal_alignment causal_alignment;
  const sage_tensor_desc *q, *k, *v;  /* required */
  const sage_tensor_desc *o;          /* required: q's shape and dtype */
  const sage_tensor_desc *lse;        /* f32 [batch, heads_q, tokens_q], contiguous: required iff write_lse */
  const sage_tensor_desc *block_mask; /* u8/bool [batch, heads_q, q_blocks, kv_blocks], contiguous, or NULL */
  void *workspace;                    /* 256-byte aligned device memory on the same device */
  size_t workspace_bytes;             /* at least sage_attention_workspace_bytes() */
  void *stream;                       /* a CUstream / cudaStream_t of that device (NULL: its default stream) */
} sage_run_args;

int sage_abi_version(void); /* SAGE_ABI_VERSION of the library: compare with the header's */
const char *sage_last_error(void);
const char *sage_version(void);

sage_status sage_attention_create(const sage_attention_config *config, sage_attention_t *out);
void sage_attention_destroy(sage_attention_t attention);

/* Workspace bytes for q and k (validated as sage_attention_run validates them; the dtype matters too: a bf16 input
 * needs an f16 copy of V for an f16 P.V). */
sage_status sage_attention_workspace_bytes(sage_attention_t attention, sage_layout layout, const sage_tensor_desc *q,
                                           const sage_tensor_desc *k, size_t *bytes);

/* The head dim to run a call of `preset` at `head_dim` with `tokens_kv` keys on a GPU of compute capability
 * `capability` (major * 10 + minor, e.g. 90) with inputs of `dtype` (SAGE_DTYPE_F16 / _BF16; 0: f16): `head_dim`
 * itself where a kernel takes it, else the next dim with a kernel (or, for sage-b and sage2-fp8 on sm_90a, with a
 * faster one). Zero-padding Q, K and V to it is exact; the caller folds its softmax scale into Q and cuts O's padded
 * channels. `block_mask`: nonzero for a block-sparse call (never padded). $SAGEGEN_SCHEDULE restricts the choice to
 * that schedule, as it does the runner's. An unknown preset, a dim no kernel can take or a GPU sagegen has no kernels
 * for gives `head_dim` back unchanged (the runner refuses it, saying why). */
sage_status sage_attention_head_dim(const char *preset, int head_dim, long long tokens_kv, int capability,
                                    sage_dtype dtype, int block_mask, int *run_head_dim);

/* The block mask's granularity: Q rows and KV tokens per mask entry. */
sage_status sage_attention_block_sizes(sage_attention_t attention, int *block_q, int *block_kv);

sage_status sage_attention_run(sage_attention_t attention, const sage_run_args *args);

/* A one-line description: variant, schedule, arch, tunables, kernel names, where each kernel came from
 * (aot / memory / disk / built) and its compile time. */
sage_status sage_attention_describe(sage_attention_t attention, char *buffer, size_t buffer_bytes);

/* ---- Variable-length (packed) batches (issue 28), FlashAttention's varlen convention ----------------------------
 * Sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and o (and of the lse's columns), and rows
 * cu_seqlens_kv[b] .. cu_seqlens_kv[b + 1] - 1 of k and v; each is attended alone, as a dense call of that one
 * sequence would (K smoothing, V's scales and the causal mask per sequence). A handle from sage_attention_create runs
 * them with the kernels of its variant's packed form, built at its first packed call (SAGE_UNSUPPORTED, with the
 * reason, where nothing runs it: SLA, block-sparse, FP4 presets). Rows of o outside every sequence are not written;
 * a sequence of no keys gets o = 0 and lse = -inf. Only the descriptors are checked: the offsets' values are never
 * read on the host (a call can be captured in a CUDA graph), and the kernels clamp them to the tensors, so wrong
 * offsets give wrong numbers, never an out-of-bounds access; the caller guarantees cu[0] = 0, non-decreasing, last
 * entry = total, and every length <= its max_seqlen. */
typedef struct sage_varlen_args {
  sage_causal_alignment causal_alignment; /* per sequence; SAGE_CAUSAL_BOTTOM_RIGHT is FlashAttention's */
  const sage_tensor_desc *q;              /* [total_q, heads_q, head_dim], head dim contiguous, 16-byte aligned rows */
  const sage_tensor_desc *k, *v;          /* [total_kv, heads_kv, head_dim] (heads_kv divides heads_q) */
  const sage_tensor_desc *o;              /* q's shape and dtype */
  const sage_tensor_desc *lse;            /* f32 [heads_q, total_q], contiguous, natural log: required iff write_lse */
  const sage_tensor_desc *cu_seqlens_q;   /* SAGE_DTYPE_I32 [batch + 1], contiguous, on the handle's device */
  const sage_tensor_desc *cu_seqlens_kv;  /* SAGE_DTYPE_I32 [batch + 1] */
  long long max_seqlen_q, max_seqlen_kv;  /* >= every sequence's length, >= 1 */
  void *workspace;                        /* 256-byte aligned device memory on the same device */
  size_t workspace_bytes;                 /* at least sage_attention_varlen_workspace_bytes() */
  void *stream;                           /* a CUstream / cudaStream_t of that device (NULL: its default stream) */
} sage_varlen_args;

/* The workspace of a packed call of `batch` sequences: that of the dense call [batch, heads, max_seqlen, head_dim]. */
sage_status sage_attention_varlen_workspace_bytes(sage_attention_t attention, long long batch, long long heads_q,
                                                  long long heads_kv, long long max_seqlen_q, long long max_seqlen_kv,
                                                  size_t *bytes);
sage_status sage_attention_run_varlen(sage_attention_t attention, const sage_varlen_args *args);

/* ---- SageBwd (issue 12): the backward pass of attention -------------------------------------------------------
 * dQ, dK, dV from Q, K, V, the forward's O and natural-log LSE, and dO (SageAttention3's Algorithm 3: int8 S, dV, dQ,
 * dK with per-block scales, dO.V^T in the input type). Every tensor is contiguous [batch, heads, tokens, head_dim]
 * (HND), 16-byte aligned, on the handle's device: q, o, d_o, d_q have heads_q heads and tokens_q tokens; k, v, d_k,
 * d_v have heads_kv (dividing heads_q: GQA sums dK, dV over a group) and tokens_kv; lse is f32 [batch, heads_q,
 * tokens_q]. Causal masks are bottom-right aligned. */
typedef struct sage_backward *sage_backward_t;

typedef struct sage_backward_config {
  const char *preset; /* a backward preset: "sagebwd" (NULL means "sagebwd") */
  int head_dim;       /* 64 or 128 */
  int causal;
  sage_dtype dtype; /* SAGE_DTYPE_F16 or SAGE_DTYPE_BF16 */
  int device;
} sage_backward_config;

typedef struct sage_backward_args {
  const sage_tensor_desc *q, *k, *v, *o, *d_o, *lse; /* inputs */
  const sage_tensor_desc *d_q, *d_k, *d_v;           /* outputs (q's dtype) */
  float softmax_scale;                               /* 0: 1 / sqrt(head_dim); else the forward's scale */
  void *workspace;                                   /* 256-byte aligned device memory on the same device */
  size_t workspace_bytes;                            /* at least sage_backward_workspace_bytes() */
  void *stream;
} sage_backward_args;

sage_status sage_backward_create(const sage_backward_config *config, sage_backward_t *out);
void sage_backward_destroy(sage_backward_t backward);
sage_status sage_backward_workspace_bytes(sage_backward_t backward, const sage_tensor_desc *q,
                                          const sage_tensor_desc *k, size_t *bytes);
sage_status sage_backward_run(sage_backward_t backward, const sage_backward_args *args);
sage_status sage_backward_describe(sage_backward_t backward, char *buffer, size_t buffer_bytes);

#ifdef __cplusplus
}
#endif

#endif /* SAGE_C_H */
