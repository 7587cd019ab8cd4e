"""PyTorch integration: the `sagegen::attention` custom op (with a fake implementation, so torch.compile traces
through it and CUDA graphs capture it), the `sageattn` drop-in, and `sdpa()` which routes
F.scaled_dot_product_attention through sagegen for a block of code."""

import contextlib
import math
import threading
import warnings
from typing import Optional, Tuple

from ._head_dim import kernel_head_dim
from ._library import BOTTOM_RIGHT, TOP_LEFT, SageArgumentError, SageUnsupportedError
from ._tensors import heads_tokens, layout_code

try:
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode
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
    return _get_current_dispatch_mode()


def run_attention(q, k, v, block_mask, preset, causal, top_left, layout, return_lse, tunables):
    """The body of `sagegen::attention`, callable without the dispatcher (SageBwd's eager route uses it). Its
    outputs are fresh tensors, as an op's must be: out, and lse (0 elements when return_lse is False)."""
    attention = _attention(preset, int(q.shape[-1]), causal, top_left, return_lse, tunables)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, layout) if return_lse else (0,), dtype=torch.float32, device=q.device)
    # A workspace per call from PyTorch's caching allocator: stream-ordered (never reused under a running
    # kernel), from the graph's pool under CUDA-graph capture, and no device allocation once warm.
    workspace = torch.empty(max(attention.workspace_bytes(q, k, layout), 1), dtype=torch.uint8, device=q.device)
    attention(q, k, v, layout=layout, out=out, lse=lse if return_lse else None, block_mask=block_mask,
              workspace=workspace)
    return out, lse


def run_attention_eager(q, k, v, block_mask, preset, causal, top_left, layout, return_lse, tunables):
    """sageattn's eager route (no dispatcher, no autograd, not compiling): the Attention's call plans, and no lse
    tensor unless asked for. The workspace comes per call from the caching allocator as the op's does (its size
    from a cache): nothing is held between calls, which matters to large models. Returns (out, lse or None)."""
    attention = _attention(preset, int(q.shape[-1]), causal, top_left, return_lse, tunables)
    workspace = torch.empty(max(attention.workspace_bytes(q, k, layout), 1), dtype=torch.uint8, device=q.device)
    result = attention(q, k, v, layout=layout, block_mask=block_mask, workspace=workspace)
    return result if return_lse else (result, None)


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
# What SageAttention's kernel-specific entry points (sageattn_qk_int8_pv_fp16_cuda, ..._fp8_cuda, ..._triton) take,
# and callers (ComfyUI nodes, diffusers' sage backends) pass on: accepted where it says what the preset does anyway.
# (dsl/builder/Presets.cpp; the -rot presets are main's rotated ones, issue 28 item 4)
_QK_GRANULARITY = {"sage-t": "per_token", "sage-vt": "per_token", "sage-b": "per_block", "sage-vb": "per_block",
                   "sage-b-rot": "per_block", "sagebwd": "per_block", "sla-int8": "per_block", "sage2-fp8": "per_warp",
                   "sage2-fp8-rot": "per_warp", "sage2-int4": "per_thread", "sage2-int4-no-smooth-q": "per_thread"}
_PV_ACCUMULATION = {"sage-t": "fp16", "sage-b": "fp16", "sage-b-rot": "fp16", "sage2-fp8": "fp32+fp32",
                    "sage2-fp8-rot": "fp32+fp32", "sage2-int4": "fp32+fp32", "sage2-int4-no-smooth-q": "fp32+fp32"}
_NO_K_QUANTIZATION = ("exact", "sla-f16", "sla-f16-elu")  # nothing to smooth: smooth_k changes nothing there
_SAGEATTENTION_OPTIONS = ("smooth_k", "smooth_v", "attn_mask", "dropout_p", "qk_quant_gran", "pv_accum_dtype",
                          "quantization_backend")


def _check_sageattention_options(preset, options):
    """SageAttention's own options, each accepted, or refused naming it: SageArgumentError for a value of the wrong
    kind, SageUnsupportedError for one no sagegen kernel computes."""
    smooth_k = options.get("smooth_k", True)
    if not isinstance(smooth_k, bool):
        raise SageArgumentError(f"smooth_k: expected True or False, got {smooth_k!r}")
    if not smooth_k and preset not in _NO_K_QUANTIZATION:
        raise SageUnsupportedError(f"smooth_k: False is not available: preset {preset!r} always smooths K (no forward "
                                   f"preset quantizes K without it; K smoothing leaves the softmax unchanged)")
    smooth_v = options.get("smooth_v", False)
    if not isinstance(smooth_v, bool):
        raise SageArgumentError(f"smooth_v: expected True or False, got {smooth_v!r}")
    if smooth_v:
        raise SageUnsupportedError("smooth_v: True is not available: no sagegen preset smooths V")
    mask = options.get("attn_mask")
    if mask is not None:
        raise SageUnsupportedError("attn_mask: an arbitrary mask is not supported by sagegen's kernels (is_causal, "
                                   "or a block-sparse block_mask, are); use PyTorch's SDPA for masked attention")
    dropout = options.get("dropout_p", 0.0)
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout <= 1.0:
        raise SageArgumentError(f"dropout_p: expected a probability, got {dropout!r}")
    if dropout:
        raise SageUnsupportedError(f"dropout_p: {dropout} is not supported (sagegen has no dropout); pass 0.0")
    for name, table in (("qk_quant_gran", _QK_GRANULARITY), ("pv_accum_dtype", _PV_ACCUMULATION)):
        value = options.get(name)
        if value is not None and value != table.get(preset):
            what = f"preset {preset!r} computes {table[preset]!r}" if preset in table else \
                f"preset {preset!r} has no such setting"
            presets = sorted(p for p, v in table.items() if v == value)
            raise SageUnsupportedError(f"{name}: {value!r} is not what {what}"
                                       + (f" (presets with {value!r}: {', '.join(presets)})" if presets else ""))
    backend = options.get("quantization_backend")
    if backend not in (None, "cuda", "triton"):
        raise SageArgumentError(f"quantization_backend: expected 'cuda' or 'triton', got {backend!r}")


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    """SageAttention's `sageattn`: q [b, h_q, n_q, d], k/v [b, h_kv, n_kv, d] ("HND") or [b, n, h, d] ("NHD"),
    f16/bf16 CUDA tensors; h_kv divides h_q. is_causal aligns top-left as sageattn and PyTorch SDPA do
    (causal_alignment="bottom-right" for FlashAttention's rule). sm_scale: default 1/sqrt(d). Returns o, or
    (o, lse) with lse the natural-log LSE [b, h_q, n_q] (f32). Options: preset ("sage-b"), tunables, block_mask,
    causal_alignment. Runs as torch.ops.sagegen.attention: torch.compile(fullgraph=True) and CUDA graphs work.

    What SageAttention's callers pass is accepted where it means what the kernels do: smooth_k=True (the presets
    smooth K), smooth_v=False, attn_mask=None, dropout_p=0.0, qk_quant_gran / pv_accum_dtype equal to the preset's,
    quantization_backend. Anything else raises SageUnsupportedError naming the argument (a wrong kind of value:
    SageArgumentError). This function never falls back; sagegen.integrations.sageattn does, to PyTorch."""
    if torch is None:
        raise ImportError("sagegen.sageattn needs PyTorch")
    # torch.compile traces the full path (the op); eager calls seen before take one lookup
    bound = None if torch.compiler.is_compiling() else _bound_calls(q, k, v, tensor_layout, is_causal, sm_scale,
                                                                    return_lse, kwargs)
    if bound and _eager(q, k, v):
        out, lse = bound(q, k, v)
        return (out, lse) if return_lse else out
    if kwargs:
        unknown = sorted(set(kwargs) - set(_SAGEATTN_OPTIONS) - set(_SAGEATTENTION_OPTIONS))
        if unknown:
            raise SageArgumentError(f"{unknown[0]}: not an option of sagegen.sageattn (options: tensor_layout, "
                                    f"is_causal, sm_scale, return_lse, {', '.join(_SAGEATTN_OPTIONS)}, "
                                    f"{', '.join(_SAGEATTENTION_OPTIONS)})")
        preset = kwargs.get("preset", "sage-b")
        _check_sageattention_options(preset, kwargs)
        alignment = kwargs.get("causal_alignment", TOP_LEFT)
        tunables, block_mask = kwargs.get("tunables") or "", kwargs.get("block_mask")
    else:  # the common call: nothing to look up
        preset, alignment, tunables, block_mask = "sage-b", TOP_LEFT, "", None
    layout_code(tensor_layout)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor):
            raise SageArgumentError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dim() != 4:
            raise SageArgumentError(f"{name}: expected a 4-D tensor ({tensor_layout}), got shape {tuple(tensor.shape)}")
    if alignment not in (TOP_LEFT, BOTTOM_RIGHT):
        raise SageArgumentError(f"causal_alignment: expected {TOP_LEFT!r} or {BOTTOM_RIGHT!r}, got {alignment!r}")
    if sm_scale is not None:
        if not isinstance(sm_scale, (int, float)) or not math.isfinite(sm_scale) or sm_scale <= 0:
            raise SageArgumentError(f"sm_scale: expected a positive finite number, got {sm_scale!r}")
    head_dim = q.shape[-1]
    padded = head_dim
    if k.shape[-1] == v.shape[-1] == head_dim and q.device.type == "cuda":
        padded = kernel_head_dim(head_dim, heads_tokens(k, tensor_layout, "k")[2], preset,
                                 torch.cuda.get_device_capability(q.device), block_mask is not None,
                                 q.dtype == torch.bfloat16)
        if padded != head_dim:  # zero channels: exact (_head_dim.py)
            q, k, v = (torch.nn.functional.pad(t, (0, padded - head_dim)) for t in (q, k, v))
    folded = False
    if sm_scale is not None or padded != head_dim:
        # the kernels scale by 1/sqrt(their d): fold the rest into q
        factor = (float(sm_scale) if sm_scale is not None else head_dim ** -0.5) * math.sqrt(padded)
        if abs(factor - 1.0) > 1e-6:
            q, folded = q * factor, True
    arguments = (q, k, v, block_mask, preset, bool(is_causal), alignment == TOP_LEFT, tensor_layout,
                 bool(return_lse), tunables)
    # The op has no autograd: with gradients wanted it must refuse at backward time, which only the op does.
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    try:
        if not wants_grad and dispatcher_free(q, k, v, *((block_mask,) if block_mask is not None else ())):
            if bound is False and padded == head_dim and not folded:
                # from now on one lookup for such calls (the library still checks each one in full)
                out, lse = _bind(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, arguments)(q, k, v)
            else:
                out, lse = run_attention_eager(*arguments)
        else:
            out, lse = torch.ops.sagegen.attention(*arguments)
    except SageUnsupportedError as error:
        if padded == head_dim:
            raise
        raise SageUnsupportedError(f"q: head dim {head_dim} (zero-padded to {padded}): {error}") from error
    if padded != head_dim:
        out = out[..., :head_dim].contiguous()
    return (out, lse) if return_lse else out


# ---- sageattn's repeated eager call: one lookup (issue 24: host time per call no more than SDPA's) ----

_bound = threading.local()  # .calls: this thread's {key: Attention.bound_call} (a bound call writes its RunArgs)
_BOUND_CALLS_PER_THREAD = 256  # bounded: many shapes (varying lengths) clear the cache rather than grow it
_BINDABLE_OPTIONS = frozenset((*_SAGEATTN_OPTIONS, *_SAGEATTENTION_OPTIONS))


def _bound_key(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs):
    """What a call's checks and plan depend on, or None where a call is never bound (a block_mask or attn_mask,
    unknown options). Calls that are keyed but never bound take the full path every time: padded head dims, an
    sm_scale other than 1/sqrt(d) (a fold into q), tensors that need the dispatcher. Option values are keyed with
    their types: smooth_k=1 is refused where smooth_k=True is not."""
    if kwargs:
        if not kwargs.keys() <= _BINDABLE_OPTIONS or kwargs.get("block_mask") is not None or \
                kwargs.get("attn_mask") is not None:
            return None
        options = tuple((name, type(value), value) for name, value in kwargs.items())
    else:
        options = ()
    return (tensor_layout, bool(is_causal), type(sm_scale), sm_scale, bool(return_lse), options,
            type(q), q.shape, q.stride(), q.dtype, q.device, type(k), k.shape, k.stride(), k.dtype, k.device,
            type(v), v.shape, v.stride(), v.dtype, v.device)


def _bound_calls(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs):
    """The bound call for this call (a function), False where the call can be bound but is not yet, None where it is
    never bound."""
    try:
        key = _bound_key(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
        if key is None:
            return None
        calls = getattr(_bound, "calls", None)
        return False if calls is None else calls.get(key, False)
    except (AttributeError, TypeError):  # not tensors, unhashable options: the full checks say what is wrong
        return None


def _eager(q, k, v):
    """Whether a bound call may run eagerly as it was bound (the tensors' types and devices are in its key; outside
    torch.compile): no dispatch mode, and no gradient wanted (the op refuses at backward time)."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return _current_dispatch_mode() is None


def _bind(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, arguments):
    """Binds a call that passed sageattn's checks and runs at the caller's head dim without a scale fold
    (`arguments` are run_attention_eager's)."""
    _, _, _, _, preset, causal, top_left, layout, lse, tunables = arguments
    bound = _attention(preset, int(q.shape[-1]), causal, top_left, lse, tunables).bound_call(q, k, v, layout)
    calls = getattr(_bound, "calls", None)
    if calls is None:
        calls = _bound.calls = {}
    if len(calls) >= _BOUND_CALLS_PER_THREAD:
        calls.clear()
    calls[_bound_key(q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)] = bound
    return bound


# ---- falling back to PyTorch: the front doors (sdpa(), sagegen.integrations) say why, once per reason ----

_said = set()
_said_lock = threading.Lock()


def say_once(door, reason, stacklevel=2):
    """Warn that `door` falls back to PyTorch because of `reason`, the first time this (door, reason) is seen.
    stacklevel: as warnings.warn's, counted from the caller of say_once."""
    key = (door, reason)
    if key in _said:
        return
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    warnings.warn(f"{door}: falling back to PyTorch's scaled_dot_product_attention: {reason}", stacklevel=stacklevel + 1)


def fallback_reason(q, k, v, attn_mask=None, dropout_p=0.0):
    """Why sagegen cannot run these inputs (None when it may try: the library can still refuse, e.g. a head dim
    without a kernel, with SageUnsupportedError). Non-tensors are not a reason: the caller's mistake raises."""
    if attn_mask is not None:
        return "an arbitrary attn_mask is not supported"
    if dropout_p:
        return "dropout is not supported"
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    devices = sorted({t.device.type for t in tensors})
    if devices != ["cuda"]:
        return f"only CUDA tensors are supported (got {', '.join(devices)} tensors)"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return (f"dtype {q.dtype} (or mixed dtypes: {q.dtype}, {k.dtype}, {v.dtype}) is not supported: float16 or "
                "bfloat16")
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "sagegen has no backward pass here (inputs require grad; sagegen.sagebwd_attention trains)"
    return None


def torch_attention(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, attn_mask=None,
                    dropout_p=0.0, bottom_right=False):
    """sageattn's contract computed by PyTorch: the fallback. GQA by repeating K/V heads; causal top-left as SDPA
    (bottom-right: FlashAttention's rule, by an explicit mask); the LSE (natural log, f32, [b, h_q, n_q]) from the
    scores in f32 when asked for."""
    import torch.nn.functional as F
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    n_q, n_kv = q.shape[2], k.shape[2]
    if is_causal and (bottom_right and n_q != n_kv or attn_mask is not None):
        keep = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril(n_kv - n_q if bottom_right else 0)
        if attn_mask is None:
            attn_mask = keep
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & keep
        else:
            attn_mask = attn_mask.masked_fill(~keep, float("-inf"))
        is_causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                         scale=sm_scale)
    if tensor_layout == "NHD":
        out = out.transpose(1, 2)
    if not return_lse:
        return out
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if is_causal:
        keep = torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else \
            scores + attn_mask.float()
    return out, torch.logsumexp(scores, dim=-1)


def _sdpa_refusal(query, key, value, attn_mask, dropout_p, enable_gqa, extra):
    if extra:
        return f"unknown arguments {sorted(extra)}"
    reason = fallback_reason(query, key, value, attn_mask, dropout_p)
    if reason is not None:
        return reason
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        return "only 4-D CUDA tensors are supported"
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
        say_once("sagegen.sdpa", reason)
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
