"""Variable-length (packed) batches (issue 28): `sageattn_varlen`, FlashAttention's `flash_attn_varlen_func`
convention. Q packed as [total_q, h_q, d], K/V as [total_k, h_kv, d], cu_seqlens_q / cu_seqlens_k int32 [batch + 1]
(cumulative lengths from 0), max_seqlen_q / max_seqlen_k host ints >= every length. Sequence b is attended alone,
exactly as a dense sagegen call on that one sequence would be; causal masks align bottom-right per sequence."""

import math
import operator
import threading
import weakref

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
    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)  # without the Python wrapper's checks
    if capturing is not None:
        return capturing()
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_offsets(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_q, max_k):
    """The offsets' values (one device-to-host copy for both)."""
    offsets = torch.cat((cu_seqlens_q, cu_seqlens_k)).tolist()
    batch = cu_seqlens_q.shape[0]
    check_offset_values("cu_seqlens_q", offsets[:batch], total_q, max_q, "max_seqlen_q")
    check_offset_values("cu_seqlens_k", offsets[batch:], total_k, max_k, "max_seqlen_k")


def _version_of(tensor):
    """The tensor's version counter (bumped by every in-place write PyTorch makes), or None where it has none (an
    inference tensor, a stand-in)."""
    try:
        return tensor._version
    except (AttributeError, RuntimeError):
        return None


class _Bound:
    """A bound packed call (Attention.bound_varlen) and the offsets it last saw checked: their tensors (weakly) and
    version counters. The values depend only on those (and on the totals and maxima, which the key holds), so the
    same unmodified offsets are not copied to the host again. Writes PyTorch does not see (a custom kernel writing
    the offsets in place) are not checked again: the kernels clamp the offsets, so wrong values give wrong numbers,
    never an out-of-bounds access."""

    __slots__ = ("call", "checked")

    def __init__(self, call):
        self.call, self.checked = call, None

    def offsets_checked(self, cu_seqlens_q, cu_seqlens_k):
        checked = self.checked
        return checked is not None and checked[0]() is cu_seqlens_q and checked[2]() is cu_seqlens_k and \
            checked[1] == _version_of(cu_seqlens_q) and checked[3] == _version_of(cu_seqlens_k)

    def remember(self, cu_seqlens_q, cu_seqlens_k):
        version_q, version_k = _version_of(cu_seqlens_q), _version_of(cu_seqlens_k)
        if version_q is None or version_k is None:
            self.checked = None
            return
        try:
            self.checked = (weakref.ref(cu_seqlens_q), version_q, weakref.ref(cu_seqlens_k), version_k)
        except TypeError:  # no weak references to it: checked every call
            self.checked = None


_bound = threading.local()  # .calls: this thread's {key: _Bound} (a bound call writes its VarlenArgs)
_BOUND_CALLS_PER_THREAD = 256  # bounded: many shapes (varying totals or maxima) clear the cache rather than grow it


def _bound_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, sm_scale, return_lse,
               preset, tunables, causal_alignment):
    """What a call's checks and plan depend on: the tensors' types, shapes, strides, dtypes and devices, the maxima
    with their types (True is refused where 1 is not) and the options. Written out: it runs on every call."""
    return (type(q), q.shape, q.stride(), q.dtype, q.device, type(k), k.shape, k.stride(), k.dtype, k.device,
            type(v), v.shape, v.stride(), v.dtype, v.device,
            type(cu_seqlens_q), cu_seqlens_q.shape, cu_seqlens_q.stride(), cu_seqlens_q.dtype, cu_seqlens_q.device,
            type(cu_seqlens_k), cu_seqlens_k.shape, cu_seqlens_k.stride(), cu_seqlens_k.dtype, cu_seqlens_k.device,
            type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k), max_seqlen_k, bool(is_causal), type(sm_scale),
            sm_scale, bool(return_lse), preset, tunables, causal_alignment)


def _bound_lookup(key):
    """The _Bound of this key, or None where none is (or the key cannot be hashed: the full checks say why)."""
    calls = getattr(_bound, "calls", None)
    if calls is None:
        return None
    try:
        return calls.get(key)
    except TypeError:
        return None


def _bind(key, bound):
    calls = getattr(_bound, "calls", None)
    if calls is None:
        calls = _bound.calls = {}
    if len(calls) >= _BOUND_CALLS_PER_THREAD:
        calls.clear()
    try:
        calls[key] = bound
    except TypeError:  # an unhashable stand-in: not bound
        pass


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
    # A call seen before (same tensors' signatures, maxima and options) skips every Python check but the offsets'
    # values (memoized by tensor and version counter) and the autograd one; the library checks the descriptors.
    try:
        key = _bound_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, sm_scale,
                         return_lse, preset, tunables, causal_alignment)
    except (AttributeError, TypeError):  # not tensors: the full checks say what is wrong
        key = None
    bound = _bound_lookup(key) if key is not None else None
    if bound is not None and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        if check_offsets and not _capturing() and not bound.offsets_checked(cu_seqlens_q, cu_seqlens_k):
            _check_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_k)
            bound.remember(cu_seqlens_q, cu_seqlens_k)
        out, lse = bound.call(q, k, v, cu_seqlens_q, cu_seqlens_k)
        return (out, lse) if return_lse else out
    max_q, max_k = check_arguments(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sm_scale,
                                   causal_alignment)
    checked = check_offsets and not _capturing()
    if checked:
        _check_offsets(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], max_q, max_k)
    reason = fallback_reason(q, k, v)
    if reason is None:
        try:
            return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal, sm_scale, return_lse, preset,
                        tunables, causal_alignment, key, checked)
        except SageUnsupportedError as error:
            reason = str(error)
    say_once(_DOOR, reason)
    return torch_varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, sm_scale, return_lse,
                                  causal_alignment == BOTTOM_RIGHT)


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal, sm_scale, return_lse, preset, tunables,
         causal_alignment, key=None, checked=False):
    """The call on sagegen's kernels. `key`: the call's _bound_key, to bind it where it runs at the caller's head dim
    without a scale fold (later such calls take the bound path); `checked`: whether its offsets' values were checked."""
    total_q, heads_q, head_dim = q.shape
    if total_q == 0 or k.shape[0] == 0:  # nothing to compute: no rows, or no keys anywhere (O = 0, LSE = -inf)
        out = torch.zeros_like(q)
        lse = torch.full((heads_q, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return (out, lse) if return_lse else out
    padded = kernel_head_dim(head_dim, max_k, preset, torch.cuda.get_device_capability(q.device), False,
                             q.dtype == torch.bfloat16)
    if padded != head_dim:  # zero channels are exact (_head_dim.py)
        q, k, v = (torch.nn.functional.pad(t, (0, padded - head_dim)) for t in (q, k, v))
    folded = False
    if sm_scale is not None or padded != head_dim:  # the kernels scale by 1/sqrt(their d): fold the rest into q
        factor = (float(sm_scale) if sm_scale is not None else head_dim ** -0.5) * math.sqrt(padded)
        if abs(factor - 1.0) > 1e-6:
            q, folded = q * factor, True
    attention = _attention(preset, padded, bool(is_causal), causal_alignment == TOP_LEFT, bool(return_lse),
                           tunables or "")
    try:
        if key is not None and padded == head_dim and not folded and type(max_q) is int and type(max_k) is int:
            bound = _Bound(attention.bound_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k))
            out, lse = bound.call(q, k, v, cu_seqlens_q, cu_seqlens_k)
            if checked:
                bound.remember(cu_seqlens_q, cu_seqlens_k)
            _bind(key, bound)  # after a call the library accepted: a refused one takes the full path again
            result = (out, lse) if return_lse else out
        else:
            result = attention.varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    except SageUnsupportedError as error:
        if padded == head_dim:
            raise
        raise SageUnsupportedError(f"q: head dim {head_dim} (zero-padded to {padded}): {error}") from error
    out, lse = result if return_lse else (result, None)
    if padded != head_dim:
        out = out[..., :head_dim].contiguous()
    return (out, lse) if return_lse else out
