/* The C ABI of sagegen: build an attention kernel from a preset or textual IR and run it on device
 * pointers. Usable from any language (the Python package uses it through ctypes, taking tensors via
 * DLPack / __cuda_array_interface__ without building against PyTorch).
 *
 * Every call returns a sage_status; on failure sage_last_error() returns this thread's message, which
 * names the argument and what was expected. Strides are in elements; the head dim is contiguous. */
#ifndef SAGE_C_H
#define SAGE_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sage_status {
  SAGE_OK = 0,
  SAGE_INVALID_ARGUMENT = 1, /* the caller's mistake: see sage_last_error() */
  SAGE_UNSUPPORTED = 2,      /* valid, but no schedule supports it on this GPU (the message says why) */
  SAGE_COMPILE_ERROR = 3,    /* NVRTC failed: the message has the kernel key and the log */
  SAGE_CUDA_ERROR = 4,       /* the driver failed */
  SAGE_INTERNAL_ERROR = 5
} sage_status;

typedef struct sage_attention *sage_attention_t;

typedef struct sage_tensor {
  void *data;
  long long batch_stride, head_stride, token_stride;
} sage_tensor;

typedef struct sage_shape {
  long long batch, heads_q, heads_kv, tokens_q, tokens_kv;
} sage_shape;

typedef enum sage_phase {
  SAGE_PHASE_ALL = 0,      /* prologue then attention */
  SAGE_PHASE_PROLOGUE = 1, /* quantization only (fills the workspace) */
  SAGE_PHASE_ATTENTION = 2 /* attention only (reads a workspace the prologue filled) */
} sage_phase;

const char *sage_last_error(void);
const char *sage_version(void);

/* dtype: "f16" or "bf16" (the storage type of Q, K, V and O). */
sage_status sage_attention_create_preset(const char *preset, int head_dim, int causal, int write_lse, const char *dtype,
                                         sage_attention_t *out);
/* As above, with the schedule's tunables set explicitly: "warps=4,stages=3" (the form `sagegen` prints; fields
 * left out keep the schedule's defaults for the current device's arch; NULL or "" = all defaults). */
sage_status sage_attention_create_preset_tuned(const char *preset, int head_dim, int causal, int write_lse,
                                               const char *dtype, const char *tunables, sage_attention_t *out);
sage_status sage_attention_create_ir(const char *ir_text, const char *dtype, sage_attention_t *out);
void sage_attention_destroy(sage_attention_t attention);

/* Workspace bytes for this shape; they depend on the dtype given at creation too (a bf16 input needs an f16 copy
 * of V for an f16 P.V). */
sage_status sage_attention_workspace_bytes(sage_attention_t attention, const sage_shape *shape, size_t *bytes);

/* lse: float [batch, heads_q, tokens_q] or NULL; block_mask: uint8 [batch, heads_q, q_blocks, kv_blocks] or NULL.
 * stream: a CUstream / cudaStream_t (NULL for the default stream). */
sage_status sage_attention_run(sage_attention_t attention, sage_phase phase, const sage_shape *shape, sage_tensor q,
                               sage_tensor k, sage_tensor v, sage_tensor o, float *lse, const unsigned char *block_mask,
                               void *workspace, size_t workspace_bytes, void *stream);

/* A one-line description: variant, schedule, arch, tunables, kernel names, where each kernel came from
 * (memory / disk / compiled) and its compile time. */
sage_status sage_attention_describe(sage_attention_t attention, char *buffer, size_t buffer_bytes);

#ifdef __cplusplus
}
#endif

#endif /* SAGE_C_H */
