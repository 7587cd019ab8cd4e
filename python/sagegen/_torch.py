"""PyTorch integration: the `sagegen::attention` custom op (with a fake implementation, so torch.compile traces
through it and CUDA graphs capture it), the `sageattn` drop-in, and `sdpa()` which routes
F.scaled_dot_product_attention through sagegen for a block of code."""

import contextlib
import math
import threading
import warnings
from typing import Optional, Tuple

from ._library import BOTTOM_RIGHT, TOP_LEFT, SageArgumentError, SageUnsupportedError
from ._tensors import heads_tokens, layout_code

try:
    import torch
except ImportError:  # sagegen.Attention works without torch for non-torch tensors; these need it
    torch = None

_attentions = {}
_attentions_lock = threading.Lock()


def _attention(preset, head_dim, causal, top_left, return_lse, tunables):
    from . import Attention  # the package's, defined before this module is imported
    key = (preset, head_dim, causal, top_left, return_lse, tunables)
    attention = _attentions.get(key)  # the lock only where one may be made
    if attention is not None:
        return attention
    with _attentions_lock:
        if key not in _attentions:
            _attentions[key] = Attention(preset, head_dim=head_dim, causal=causal, lse=return_lse,
                                         tunables=tunables or None,
                                         causal_alignment=TOP_LEFT if top_left else BOTTOM_RIGHT)
        return _attentions[key]


def _lse_shape(q, layout):
    batch, heads, tokens, _ = heads_tokens(q, layout, "q")
    return (batch, heads, tokens)


def dispatcher_free(*tensors):
    """Whether a call may skip PyTorch's dispatcher and run the op's body directly: in eager mode on plain tensors.
    The custom ops' dispatch costs host time (measured on the H100 machine: a SageBwd training step at N = 256,
    0.94 ms through the ops, 0.69-0.80 ms without; its kernels take less at small sizes). torch.compile, export,
    tensor subclasses (fake, functional), dispatch modes and non-CUDA tensors (meta: the fake kernels; host: the
    library's refusal) still go through the ops."""
    if torch.compiler.is_compiling() or _current_dispatch_mode() is not None:
        return False
    return all(type(tensor) is torch.Tensor and tensor.is_cuda for tensor in tensors)


def _current_dispatch_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    return _get_current_dispatch_mode()


def run_attention(q, k, v, block_mask, preset, causal, top_left, layout, return_lse, tunables):
    """The body of `sagegen::attention`, callable without the dispatcher (the eager paths' fast route)."""
    attention = _attention(preset, int(q.shape[-1]), causal, top_left, return_lse, tunables)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, layout) if return_lse else (0,), dtype=torch.float32, device=q.device)
    # A workspace per call from PyTorch's caching allocator: stream-ordered (never reused under a running
    # kernel), from the graph's pool under CUDA-graph capture, and no device allocation once warm.
    workspace = torch.empty(max(attention.workspace_bytes(q, k, layout), 1), dtype=torch.uint8, device=q.device)
    attention(q, k, v, layout=layout, out=out, lse=lse if return_lse else None, block_mask=block_mask,
              workspace=workspace)
    return out, lse


if torch is not None:
    @torch.library.custom_op("sagegen::attention", mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Optional[torch.Tensor],
                     preset: str, causal: bool, top_left: bool, layout: str, return_lse: bool,
                     tunables: str) -> Tuple[torch.Tensor, torch.Tensor]:
        return run_attention(q, k, v, block_mask, preset, causal, top_left, layout, return_lse, tunables)

    @attention_op.register_fake
    def _attention_fake(q, k, v, block_mask, preset, causal, top_left, layout, return_lse, tunables):
        out = q.new_empty(q.shape)
        lse = q.new_empty(_lse_shape(q, layout) if return_lse else (0,), dtype=torch.float32)
        return out, lse


_SAGEATTN_OPTIONS = ("preset", "causal_alignment", "tunables", "block_mask")


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """SageAttention's `sageattn`: q [b, h_q, n_q, d], k/v [b, h_kv, n_kv, d] ("HND") or [b, n, h, d] ("NHD"),
    f16/bf16 CUDA tensors; h_kv divides h_q. is_causal aligns top-left as sageattn and PyTorch SDPA do
    (causal_alignment="bottom-right" for FlashAttention's rule). sm_scale: default 1/sqrt(d). Returns o, or
    (o, lse) with lse the natural-log LSE [b, h_q, n_q] (f32). Options: preset ("sage-b"), tunables, block_mask,
    causal_alignment. Runs as torch.ops.sagegen.attention: torch.compile(fullgraph=True) and CUDA graphs work."""
    if torch is None:
        raise ImportError("sagegen.sageattn needs PyTorch")
    unknown = sorted(set(kwargs) - set(_SAGEATTN_OPTIONS))
    if unknown:
        raise SageArgumentError(f"{unknown[0]}: not an option of sagegen.sageattn (options: tensor_layout, "
                                f"is_causal, sm_scale, return_lse, {', '.join(_SAGEATTN_OPTIONS)})")
    layout_code(tensor_layout)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise SageArgumentError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise SageArgumentError(f"{name}: expected a 4-D tensor ({tensor_layout}), got shape {tuple(tensor.shape)}")
    alignment = kwargs.get("causal_alignment", TOP_LEFT)
    if alignment not in (TOP_LEFT, BOTTOM_RIGHT):
        raise SageArgumentError(f"causal_alignment: expected {TOP_LEFT!r} or {BOTTOM_RIGHT!r}, got {alignment!r}")
    head_dim = q.shape[-1]
    if sm_scale is not None:
        if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
            raise SageArgumentError(f"sm_scale: expected a positive finite number, got {sm_scale!r}")
        factor = float(sm_scale) * math.sqrt(head_dim)
        if abs(factor - 1.0) > 1e-6:  # the kernels scale by 1/sqrt(d): fold the rest into q
            q = q * factor
    arguments = (q, k, v, kwargs.get("block_mask"), kwargs.get("preset", "sage-b"), bool(is_causal),
                 alignment == TOP_LEFT, tensor_layout, bool(return_lse), kwargs.get("tunables") or "")
    # The op has no autograd: with gradients wanted it must refuse at backward time, which only the op does.
    wants_grad = torch.is_grad_enabled() and any(tensor.requires_grad for tensor in (q, k, v))
    if not wants_grad and dispatcher_free(*(tensor for tensor in (q, k, v, arguments[3]) if tensor is not None)):
        out, lse = run_attention(*arguments)
    else:
        out, lse = torch.ops.sagegen.attention(*arguments)
    return (out, lse) if return_lse else out


_said = set()


def _say_once(reason):
    if reason not in _said:
        _said.add(reason)
        warnings.warn(f"sagegen.sdpa: falling back to PyTorch's scaled_dot_product_attention: {reason}",
                      stacklevel=3)


def _sdpa_refusal(query, key, value, attn_mask, dropout_p, enable_gqa, extra):
    if extra:
        return f"unknown arguments {sorted(extra)}"
    if attn_mask is not None:
        return "an arbitrary attn_mask is not supported"
    if dropout_p:
        return "dropout is not supported"
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_cuda for t in tensors):
        return "only 4-D CUDA tensors are supported"
    if query.dtype not in (torch.float16, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (or mixed dtypes) is not supported: float16 or bfloat16"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "sagegen has no backward pass (inputs require grad)"
    if key.shape[1] != query.shape[1] and not enable_gqa:
        return "different head counts without enable_gqa"
    return None


@contextlib.contextmanager
def sdpa(preset="sage-b", tunables=None):
    """Within the block, torch.nn.functional.scaled_dot_product_attention runs sagegen where it can (is_causal
    top-left as SDPA, scale, enable_gqa) and PyTorch's own otherwise (attn_mask, dropout, other dtypes, head dims
    without a kernel, autograd), saying so once per reason."""
    if torch is None:
        raise ImportError("sagegen.sdpa needs PyTorch")
    import torch.nn.functional as F
    original = F.scaled_dot_product_attention

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
               **extra):
        reason = _sdpa_refusal(query, key, value, attn_mask, dropout_p, enable_gqa, extra)
        if reason is None:
            try:
                return sageattn(query, key, value, "HND", is_causal, scale, preset=preset, tunables=tunables)
            except SageUnsupportedError as error:
                reason = str(error)
        _say_once(reason)
        kwargs = dict(extra)
        if enable_gqa:
            kwargs["enable_gqa"] = enable_gqa
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, **kwargs)

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
