/* SLA (sparse-linear attention, issue 13) through the C ABI: its forward returns O^s and O^l apart, so that the
 * caller applies its own Proj (the Python package: a torch.nn.Linear the caller owns) and differentiates it; its
 * backward takes dO^s and dO^l and returns dQ, dK, dV of the exact formula. Tensors: q/k/v HND contiguous
 * ([batch, heads, tokens, head_dim]) in the SLA object's dtype (config.dtype: f16 or bf16), o_sparse in that dtype too,
 * and o_linear, d_sparse, d_linear, dq f32 [batch, heads_q, tokens_q,
 * head_dim], dk, dv f32 [batch, heads_kv, tokens_kv, head_dim], all contiguous on the SLA object's device, aligned to
 * their element size (the forward's q, k, v to 16 bytes, its o_sparse to 4); no output overlaps another argument or
 * the workspace. Errors as in sage_c.h (sage_last_error() names the argument). The backward takes o_sparse too,
 * optionally: the forward's O^s as it returned it; with an exact sparse part (sla-f16, sla-f16-elu) the forward saved L
 * in the workspace, and the backward then forms D^s from O^s instead of recomputing the sparse part's statistics. */
#ifndef SAGE_SLA_C_H
#define SAGE_SLA_C_H

#include "sage/sage_c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sage_sla *sage_sla_t;

typedef struct sage_sla_config {
  const char *preset;        /* "sla-f16", "sla-int8" or "sla-f16-elu" (the sparse part's quantizers, phi) */
  int head_dim;              /* 64 or 128 */
  double critical_percent;   /* k_h in (0, 100]; <= 0: the preset's (5) */
  double negligible_percent; /* k_l in [0, 100); < 0: the preset's (10) */
  int feature_map;           /* 0 softmax, 1 elu + 1, 2 relu; -1: the preset's */
  int device;
  sage_dtype dtype; /* SAGE_DTYPE_F16 or SAGE_DTYPE_BF16: q, k, v and o_sparse (0: f16, for zeroed configs) */
} sage_sla_config;

typedef struct sage_sla_args {
  const sage_tensor_desc *q, *k, *v;
  const sage_tensor_desc *o_sparse, *o_linear; /* forward outputs; o_sparse optional in the backward (above) */
  const sage_tensor_desc *d_sparse, *d_linear; /* backward inputs (NULL in the forward) */
  const sage_tensor_desc *dq, *dk, *dv;        /* backward outputs (NULL in the forward) */
  void *workspace;                             /* the same for a forward and its backward; 256-byte aligned */
  size_t workspace_bytes;                      /* at least sage_sla_workspace()'s */
  void *stream;
} sage_sla_args;

sage_status sage_sla_create(const sage_sla_config *config, sage_sla_t *out);
void sage_sla_destroy(sage_sla_t sla);
/* The workspace for q and k (forward and backward), and where M_c lies in it: int8 [batch, heads_q, q_blocks,
 * kv_blocks] at classes_offset (1 critical, 0 marginal, -1 negligible), valid after sage_sla_forward. */
sage_status sage_sla_workspace(sage_sla_t sla, const sage_tensor_desc *q, const sage_tensor_desc *k, size_t *bytes,
                               size_t *classes_offset, int *q_blocks, int *kv_blocks);
sage_status sage_sla_forward(sage_sla_t sla, const sage_sla_args *args);
sage_status sage_sla_backward(sage_sla_t sla, const sage_sla_args *args);

#ifdef __cplusplus
}
#endif

#endif /* SAGE_SLA_C_H */
