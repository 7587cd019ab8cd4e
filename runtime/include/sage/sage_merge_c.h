/* The LSE merge of two partial attention results (issue 30) through the C ABI: for every row (batch, head, token),
 *
 *   o_out = e^(lse_a - L) o_a + e^(lse_b - L) o_b,   lse_out = L = log(e^(lse_a) + e^(lse_b))
 *
 * in f32 arithmetic, shifted by the row's larger LSE. Exact for masked rows: a part with LSE = -inf contributes
 * nothing and its O is ignored (it may be NaN); a row with both at -inf gets lse_out = -inf and o_out = 0. One
 * kernel on the caller's stream, compiled with NVRTC on first use for the device and the three O dtypes (then cached).
 *
 * Tensors: o_a, o_b, o_out 4-D in `layout` (sage_c.h's sage_layout), one shape, each f16, bf16 or f32 (independently:
 * e.g. an f32 accumulator merged with a bf16 part, or two parts into a bf16 output), any element strides except the
 * head dim's, which must be 1; the head dim a multiple of 8 up to 1024. lse_a, lse_b, lse_out f32 [batch, heads,
 * tokens], any strides. All on one CUDA device, aligned to their element size (16-byte aligned data and strides take
 * the vector path). Written: o_out and lse_out; o_out may be o_a and lse_out lse_a exactly (same data, dtype and
 * strides: the running in-place form); any other overlap with a written tensor is refused. Errors as in sage_c.h
 * (sage_last_error() names the argument).
 *
 * Added within ABI version 3 (a new function, no struct changed): a caller that must run on older libraries looks the
 * symbol up before calling it. */
#ifndef SAGE_MERGE_C_H
#define SAGE_MERGE_C_H

#include "sage/sage_c.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sage_merge_args {
  sage_layout layout;
  const sage_tensor_desc *o_a, *lse_a;     /* part A (or the running accumulator) */
  const sage_tensor_desc *o_b, *lse_b;     /* part B */
  const sage_tensor_desc *o_out, *lse_out; /* the merge; may be part A's tensors exactly */
  void *stream;                            /* a CUstream / cudaStream_t of the tensors' device (NULL: its default) */
} sage_merge_args;

sage_status sage_merge_attention(const sage_merge_args *args);

#ifdef __cplusplus
}
#endif

#endif /* SAGE_MERGE_C_H */
