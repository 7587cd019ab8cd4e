"""Variable-length (packed) batches (issue 28): `sageattn_varlen`, FlashAttention's `flash_attn_varlen_func`
convention. Q packed as [total_q, h_q, d], K/V as [total_k, h_kv, d], cu_seqlens_q / cu_seqlens_k int32 [batch + 1]
(cumulative lengths from 0), max_seqlen_q / max_seqlen_k host ints >= every length. Sequence b is attended alone,
exactly as a dense sagegen call on that one sequence would be; causal masks align bottom-right per sequence."""

import math
import operator

from ._head_dim import kernel_head_dim
from ._library import BOTTOM_RIGHT, TOP_LEFT, SageArgumentError, SageUnsupportedError
from ._torch import _attention, fallback_reason, say_once, torch

_DOOR = "sagegen.sageattn_varlen"


def _int(value, name):
    """A host int (Python or numpy/torch scalar): never a tensor read here."""
    if isinstance(value, bool):
        raise SageArgumentError(f"{name}: expected an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise SageArgumentError(f"{name}: expected an int (an upper bound of the sequences' lengths), got "
                                f"{type(value).__name__}") from None


def check_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale, causal_alignment):
    """Everything about the call but the offsets' values (duck-typed: shape, dtype, device). Returns the maxima."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        shape = getattr(tensor, "shape", None)
        if shape is None or len(shape) != 3:
            raise SageArgumentError(f"{name}: expected a 3-D tensor [total, heads, head_dim], got "
                                    f"{tuple(shape) if shape is not None else type(tensor).__name__}")
    if tuple(v.shape) != tuple(k.shape):
        raise SageArgumentError(f"v: shape {tuple(v.shape)} must equal k's {tuple(k.shape)}")
    if k.shape[2] != q.shape[2]:
        raise SageArgumentError(f"k: head dim {k.shape[2]} must equal q's {q.shape[2]}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1] != 0:
        raise SageArgumentError(f"k: {k.shape[1]} heads must divide q's {q.shape[1]} (grouped-query attention)")
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        shape = getattr(offsets, "shape", None)
        if shape is None or len(shape) != 1 or shape[0] < 2:
            raise SageArgumentError(f"{name}: expected a 1-D tensor of batch + 1 >= 2 cumulative lengths, got "
                                    f"{tuple(shape) if shape is not None else type(offsets).__name__}")
        if str(offsets.dtype).replace("torch.", "") != "int32":
            raise SageArgumentError(f"{name}: expected dtype int32, got {offsets.dtype}")
        if offsets.device != q.device:
            raise SageArgumentError(f"{name}: is on {offsets.device}, expected q's device {q.device}")
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise SageArgumentError(f"cu_seqlens_k: {cu_seqlens_k.shape[0]} entries, cu_seqlens_q has "
                                f"{cu_seqlens_q.shape[0]} (both batch + 1)")
    maxima = []
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        value = _int(value, name)
        if value < 1 or value >= 2 ** 31:
            raise SageArgumentError(f"{name}: expected an upper bound of the lengths in [1, 2^31), got {value}")
        maxima.append(value)
    if sm_scale is not None and (isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or
                                 not math.isfinite(sm_scale) or sm_scale <= 0):
        raise SageArgumentError(f"sm_scale: expected a positive finite number, got {sm_scale!r}")
    if causal_alignment not in (BOTTOM_RIGHT, TOP_LEFT):
        raise SageArgumentError(f"causal_alignment: expected {BOTTOM_RIGHT!r} or {TOP_LEFT!r}, got "
                                f"{causal_alignment!r}")
    return maxima


def check_offset_values(name, offsets, total, maximum, max_name):
    """The values of one cu_seqlens (a host list): from 0, non-decreasing, ending at the packed tensor's total, no
    length above the call's maximum."""
    if offsets[0] != 0:
        raise SageArgumentError(f"{name}: must start at 0, got {offsets[0]}")
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    for index, length in enumerate(lengths):
        if length < 0:
            raise SageArgumentError(f"{name}: must be non-decreasing, but entry {index + 1} ({offsets[index + 1]}) < "
                                    f"entry {index} ({offsets[index]})")
    if offsets[-1] != total:
        raise SageArgumentError(f"{name}: the last entry ({offsets[-1]}) must equal the packed tensor's {total} "
                                "tokens")
    longest = max(lengths)
    if longest > maximum:
        raise SageArgumentError(f"{max_name}: {maximum} is below sequence {lengths.index(longest)}'s length "
                                f"{longest} ({name})")


def _capturing():
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def torch_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal=False, sm_scale=None, return_lse=False,
                           bottom_right=True):
    """The same contract computed by PyTorch, one SDPA per sequence (reads the offsets on the host): the fallback
    and the tests' reference. A sequence with no keys gets O = 0 and LSE = -inf."""
    import torch.nn.functional as F
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    heads_q, groups = q.shape[1], q.shape[1] // k.shape[1]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q)
    lse = torch.full((heads_q, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[b], cu_q[b + 1], cu_k[b], cu_k[b + 1]
        if q1 <= q0 or k1 <= k0:
            continue
        qs = q[q0:q1].transpose(0, 1)
        ks, vs = (t[k0:k1].transpose(0, 1).repeat_interleave(groups, dim=0) for t in (k, v))
        n_q, n_k = q1 - q0, k1 - k0
        mask = None
        if is_causal:
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q if bottom_right else 0)
        out[q0:q1] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale).transpose(0, 1)
        if return_lse:
            scores = torch.matmul(qs.float(), ks.float().transpose(-1, -2)) * scale
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            lse[:, q0:q1] = torch.logsumexp(scores, dim=-1)
    if is_causal:  # rows that see no key (bottom-right, more queries than keys): O = 0, as the kernels write
        out = torch.nan_to_num(out, nan=0.0)
    return (out, lse) if return_lse else out


def sageattn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, sm_scale=None,
                    return_lse=False, preset="sage-b", tunables=None, causal_alignment=BOTTOM_RIGHT,
                    check_offsets=True):
    """FlashAttention's `flash_attn_varlen_func` on sagegen's kernels: q [total_q, h_q, d], k/v [total_k, h_kv, d]
    (f16 / bf16 CUDA tensors, any row strides with a contiguous head dim, e.g. views of a fused QKV projection),
    cu_seqlens_q / cu_seqlens_k int32 [batch + 1] on q's device, max_seqlen_q / max_seqlen_k host ints >= every
    length (fixed maxima keep one kernel grid, e.g. for CUDA graphs). is_causal aligns bottom-right per sequence as
    FlashAttention does (causal_alignment="top-left" for SDPA's rule). sm_scale: default 1/sqrt(d). Returns o
    [total_q, h_q, d], or (o, lse) with lse the natural-log LSE f32 [h_q, total_q].

    In eager mode the offsets' values are checked (one small device-to-host copy: from 0, non-decreasing, ending at
    the totals, lengths within the maxima); not under CUDA-graph capture, and not with check_offsets=False. Where
    sagegen cannot run the call (other dtypes or devices, autograd, a preset without packed kernels) it falls back to
    PyTorch (one SDPA per sequence), warning once per reason."""
    if torch is None:
        raise ImportError("sagegen.sageattn_varlen needs PyTorch")
    max_q, max_k = check_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale,
                                   causal_alignment)
    if check_offsets and not _capturing():
        offsets = torch.cat((cu_seqlens_q, cu_seqlens_k)).tolist()  # one copy for both
        batch = cu_seqlens_q.shape[0]
        check_offset_values("cu_seqlens_q", offsets[:batch], q.shape[0], max_q, "max_seqlen_q")
        check_offset_values("cu_seqlens_k", offsets[batch:], k.shape[0], max_k, "max_seqlen_k")
    reason = fallback_reason(q, k, v)
    if reason is None:
        try:
            return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal, sm_scale, return_lse, preset,
                        tunables, causal_alignment)
        except SageUnsupportedError as error:
            reason = str(error)
    say_once(_DOOR, reason)
    return torch_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, sm_scale, return_lse,
                                  causal_alignment == BOTTOM_RIGHT)


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal, sm_scale, return_lse, preset, tunables,
         causal_alignment):
    total_q, heads_q, head_dim = q.shape
    if total_q == 0 or k.shape[0] == 0:  # nothing to compute: no rows, or no keys anywhere (O = 0, LSE = -inf)
        out = torch.zeros_like(q)
        lse = torch.full((heads_q, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    padded = kernel_head_dim(head_dim, max_k, preset, torch.cuda.get_device_capability(q.device), False,
                             q.dtype == torch.bfloat16)
    if padded != head_dim:  # zero channels are exact (_head_dim.py)
        q, k, v = (torch.nn.functional.pad(t, (0, padded - head_dim)) for t in (q, k, v))
    if sm_scale is not None or padded != head_dim:  # the kernels scale by 1/sqrt(their d): fold the rest into q
        factor = (float(sm_scale) if sm_scale is not None else head_dim ** -0.5) * math.sqrt(padded)
        if abs(factor - 1.0) > 1e-6:
            q = q * factor
    attention = _attention(preset, padded, bool(is_causal), causal_alignment == TOP_LEFT, bool(return_lse),
                           tunables or "")
    try:
        result = attention.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    except SageUnsupportedError as error:
        if padded == head_dim:
            raise
        raise SageUnsupportedError(f"q: head dim {head_dim} (zero-padded to {padded}): {error}") from error
    out, lse = result if return_lse else (result, None)
    if padded != head_dim:
        out = out[..., :head_dim].contiguous()
    return (out, lse) if return_lse else out
