"""SageBwd (issue 12) from PyTorch: trainable INT8 attention.

`sagebwd_attention(q, k, v, is_causal=False, scale=None)` runs a quantized forward kernel (preset `sage-b` by default:
int8 Q.K^T) that writes the LSE, and on backward SageAttention3's Algorithm 3 (int8 S, dV, dQ, dK with per-block
scales, dO.V^T in the input type; K smoothed: S and dQ from K - mean(K), P from the LSE shifted to match). It is
`torch.ops.sagegen.sagebwd_attention`, a custom op whose backward is registered with torch.library.register_autograd
(so torch.compile sees both), and `SageBwdFunction`, the same as a torch.autograd.Function. Tensors are [batch,
heads, tokens, head_dim] (HND), f16 or bf16, head_dim 64 or 128; k and v may have fewer heads (GQA). Causal masks are
bottom-right aligned (the same as top-left when tokens_q == tokens_kv).
The LSE output carries no gradient (its incoming gradient is ignored).

Rotation (issue 25): a rotated forward preset (`sage-b-rot`, `sage2-fp8-rot`: Q and K rotated along d by a randomized
Hadamard transform before quantization, for Q outlier channels) pairs with the rotated backward preset
`sagebwd-rot-qks` (rotated; P and dS scaled per key for dV and dK, and dS scaled per query for dQ). On K offsets + Q
outlier channels (H200, runs 46 and 51): per key, dK / dV rel-L1 0.047 / 0.041 against `sagebwd-rot`'s 0.093 / 0.105;
per query, dQ 0.038 against 0.055 at d 128 and 0.050 against 0.059 at d 64; forward + backward 0-5% slower than
`sagebwd-rot-ks` (per key only), which was 3-10% slower than `sagebwd-rot`. `rotate=True` picks both (the forward
preset's `-rot` form), `rotate=False` neither, `rotate=None` follows the forward preset's name.
"""

import ctypes
import math
import threading
import weakref
from typing import Tuple

from ._library import SageArgumentError, TensorDesc, check, library
from ._tensors import DTYPE_NAMES, describe
from ._torch import dispatcher_free, run_attention

try:
    import torch
except ImportError:
    torch = None


class BackwardConfig(ctypes.Structure):
    _fields_ = [("preset", ctypes.c_char_p), ("head_dim", ctypes.c_int), ("causal", ctypes.c_int),
                ("dtype", ctypes.c_int), ("device", ctypes.c_int)]


class BackwardArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.POINTER(TensorDesc)) for name in ("q", "k", "v", "o", "d_o", "lse", "d_q", "d_k", "d_v")]
    _fields_ += [("softmax_scale", ctypes.c_float), ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t),
                 ("stream", ctypes.c_void_p)]


_declared = False


def _library():
    global _declared
    loaded = library()
    if not _declared:
        loaded.sage_backward_create.argtypes = [ctypes.POINTER(BackwardConfig), ctypes.POINTER(ctypes.c_void_p)]
        loaded.sage_backward_destroy.argtypes = [ctypes.c_void_p]
        loaded.sage_backward_workspace_bytes.argtypes = [ctypes.c_void_p, ctypes.POINTER(TensorDesc),
                                                         ctypes.POINTER(TensorDesc), ctypes.POINTER(ctypes.c_size_t)]
        loaded.sage_backward_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(BackwardArgs)]
        loaded.sage_backward_describe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        for name in ("sage_backward_create", "sage_backward_workspace_bytes", "sage_backward_run",
                     "sage_backward_describe"):
            getattr(loaded, name).restype = ctypes.c_int
        _declared = True
    return loaded


class _BackwardRunner:
    """One C handle: the backward kernels of (preset, head_dim, causal) for one device and dtype."""

    def __init__(self, preset, head_dim, causal, dtype, device):
        loaded = _library()
        config = BackwardConfig(preset.encode(), head_dim, int(causal), dtype, device)
        handle = ctypes.c_void_p()
        check(loaded.sage_backward_create(ctypes.byref(config), ctypes.byref(handle)))
        self.handle = handle
        # Not __del__: runners cached in _runners live until interpreter shutdown, when module globals may already
        # be None. weakref.finalize holds the destroy function itself and runs at exit before that teardown.
        self._finalizer = weakref.finalize(self, loaded.sage_backward_destroy, handle)
        self._workspace_sizes = {}  # (q shape, k shape) -> bytes: one library call per shape, not per call

    def workspace_bytes(self, q_desc, k_desc):
        key = (tuple(q_desc.shape), tuple(k_desc.shape))
        needed = self._workspace_sizes.get(key)
        if needed is None:
            size = ctypes.c_size_t()
            check(_library().sage_backward_workspace_bytes(self.handle, ctypes.byref(q_desc), ctypes.byref(k_desc),
                                                           ctypes.byref(size)))
            if len(self._workspace_sizes) >= 1024:  # many shapes (varying lengths): bounded, not a leak
                self._workspace_sizes.clear()
            needed = self._workspace_sizes[key] = size.value
        return needed

    def describe(self):
        buffer = ctypes.create_string_buffer(4096)
        check(_library().sage_backward_describe(self.handle, buffer, len(buffer)))
        return buffer.value.decode()


_runners = {}
_runners_lock = threading.Lock()


def backward_runner(preset, head_dim, causal, dtype, device):
    key = (preset, head_dim, bool(causal), dtype, device)
    runner = _runners.get(key)  # the lock only where one may be made
    if runner is not None:
        return runner
    with _runners_lock:
        if key not in _runners:
            _runners[key] = _BackwardRunner(preset, head_dim, causal, dtype, device)
        return _runners[key]


def run_backward(q, k, v, o, lse, d_o, d_q, d_k, d_v, causal, scale, workspace_allocator, stream, preset="sagebwd"):
    """Runs the backward on described tensors (all contiguous HND on one CUDA device; the library checks them)."""
    descs = {name: describe(t, name) for name, t in
             (("q", q), ("k", k), ("v", v), ("o", o), ("d_o", d_o), ("lse", lse), ("d_q", d_q), ("d_k", d_k),
              ("d_v", d_v))}
    if descs["q"].device < 0:
        raise SageArgumentError("q: is in host memory, expected a CUDA tensor")
    if descs["q"].dtype not in DTYPE_NAMES:
        raise SageArgumentError("q: expected dtype float16 or bfloat16")
    runner = backward_runner(preset, int(q.shape[-1]), causal, descs["q"].dtype, descs["q"].device)
    needed = runner.workspace_bytes(descs["q"], descs["k"])
    workspace = workspace_allocator(needed)
    args = BackwardArgs(*[ctypes.pointer(descs[name]) for name in
                          ("q", "k", "v", "o", "d_o", "lse", "d_q", "d_k", "d_v")])
    args.softmax_scale = float(scale)
    args.workspace, args.workspace_bytes, args.stream = workspace.data_ptr(), needed, stream
    check(_library().sage_backward_run(runner.handle, ctypes.byref(args)))


ROTATED_SUFFIX = "-rot"  # the rotated forward presets' names (rotatedPresets() in dsl/builder/Presets.cpp)
ROTATED_BACKWARD = "sagebwd-rot-qks"  # the rotated backward preset they pair with (the module docstring says why)


def paired_presets(forward_preset, rotate):
    """(forward preset, backward preset) for sagebwd_attention: a rotated forward pairs with ROTATED_BACKWARD."""
    if not isinstance(forward_preset, str) or not forward_preset:
        raise SageArgumentError(f"forward_preset: expected a preset name, got {forward_preset!r}")
    if rotate not in (None, True, False):
        raise SageArgumentError(f"rotate: expected None, True or False, got {rotate!r}")
    rotated = forward_preset.endswith(ROTATED_SUFFIX)
    if rotate and not rotated:
        forward_preset, rotated = forward_preset + ROTATED_SUFFIX, True
    elif rotate is False and rotated:
        raise SageArgumentError(f"rotate: False, but forward_preset '{forward_preset}' rotates Q and K")
    return forward_preset, (ROTATED_BACKWARD if rotated else "sagebwd")


def _backward_body(q, k, v, o, lse, d_o, causal, scale, preset="sagebwd"):
    """The body of `sagegen::attention_backward`: (dQ, dK, dV)."""
    q, k, v, o, lse, d_o = (t.contiguous() for t in (q, k, v, o, lse, d_o))
    d_q, d_k, d_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        # From the caching allocator on this stream: never reused under a running kernel.
        allocate = lambda size: torch.empty(max(size, 1), dtype=torch.uint8, device=q.device)  # noqa: E731
        run_backward(q, k, v, o, lse, d_o.to(q.dtype), d_q, d_k, d_v, causal, scale, allocate, stream, preset)
    return d_q, d_k, d_v


def _forward_body(q, k, v, causal, scale, forward_preset):
    """The body of `sagegen::sagebwd_attention`: (O, LSE) from the forward preset's kernel."""
    factor = scale * math.sqrt(q.shape[-1])  # the forward kernels scale by 1/sqrt(d): fold the rest into q
    q_in = q.contiguous() if abs(factor - 1.0) <= 1e-6 else (q * factor).contiguous()
    return run_attention(q_in, k.contiguous(), v.contiguous(), None, forward_preset, causal, False, "HND", True, "")


if torch is not None:
    @torch.library.custom_op("sagegen::attention_backward", mutates_args=())
    def attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                              d_o: torch.Tensor, causal: bool, scale: float,
                              preset: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _backward_body(q, k, v, o, lse, d_o, causal, scale, preset)

    @attention_backward_op.register_fake
    def _attention_backward_fake(q, k, v, o, lse, d_o, causal, scale, preset):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    @torch.library.custom_op("sagegen::sagebwd_attention", mutates_args=())
    def sagebwd_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                             forward_preset: str) -> Tuple[torch.Tensor, torch.Tensor]:
        return _forward_body(q, k, v, causal, scale, forward_preset)

    @sagebwd_attention_op.register_fake
    def _sagebwd_attention_fake(q, k, v, causal, scale, forward_preset):
        return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)

    def _setup_context(ctx, inputs, output):
        q, k, v, causal, scale, forward_preset = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale = causal, scale
        ctx.backward_preset = paired_presets(forward_preset, None)[1]
        # The LSE's gradient is ignored: without this the engine fills a zero tensor for it on every backward, whose
        # launch from the autograd thread took ~0.6 ms of host time per step (H100, N = 4096, torch profiler).
        ctx.set_materialize_grads(False)

    def _backward(ctx, grad_out, grad_lse):
        if grad_out is None:  # only the LSE was used: no gradient reaches q, k, v
            return None, None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        d_q, d_k, d_v = torch.ops.sagegen.attention_backward(q, k, v, out, lse, grad_out, ctx.causal, ctx.scale,
                                                             ctx.backward_preset)
        return d_q, d_k, d_v, None, None, None

    torch.library.register_autograd("sagegen::sagebwd_attention", _backward, setup_context=_setup_context)

    class SageBwdFunction(torch.autograd.Function):
        """The same computation as a torch.autograd.Function: saves q, k, v, O and the LSE; backward returns dQ,
        dK, dV from the SageBwd kernels. In eager mode on plain tensors it runs the ops' bodies without the
        dispatcher (sagebwd_attention's eager route); otherwise it calls the ops."""

        @staticmethod
        def forward(ctx, q, k, v, causal, scale, forward_preset):
            if dispatcher_free(q, k, v):
                out, lse = _forward_body(q, k, v, causal, scale, forward_preset)
            else:
                out, lse = torch.ops.sagegen.sagebwd_attention(q, k, v, causal, scale, forward_preset)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.causal, ctx.scale = causal, scale
            ctx.backward_preset = paired_presets(forward_preset, None)[1]
            ctx.mark_non_differentiable(lse)
            ctx.set_materialize_grads(False)  # as _setup_context: no zero tensor for the LSE's ignored gradient
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            if grad_out is None:
                return None, None, None, None, None, None
            q, k, v, out, lse = ctx.saved_tensors
            if dispatcher_free(q, k, v, out, lse, grad_out):
                d_q, d_k, d_v = _backward_body(q, k, v, out, lse, grad_out, ctx.causal, ctx.scale,
                                               ctx.backward_preset)
            else:
                d_q, d_k, d_v = torch.ops.sagegen.attention_backward(q, k, v, out, lse, grad_out, ctx.causal,
                                                                     ctx.scale, ctx.backward_preset)
            return d_q, d_k, d_v, None, None, None


def sagebwd_attention(q, k, v, is_causal=False, scale=None, forward_preset="sage-b", return_lse=False, rotate=None):
    """Trainable quantized attention: o = softmax(q k^T * scale) v with SageBwd's gradients. q [b, h_q, n_q, d],
    k/v [b, h_kv, n_kv, d] (HND), f16/bf16 CUDA tensors, d 64 or 128; scale defaults to 1/sqrt(d). rotate: Q and K
    rotated in both passes (for Q outlier channels; None: as forward_preset, whose `-rot` presets rotate)."""
    if torch is None:
        raise ImportError("sagegen.sagebwd_attention needs PyTorch")
    forward_preset, _ = paired_presets(forward_preset, rotate)
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise SageArgumentError(f"{name}: expected a 4-D torch.Tensor [batch, heads, tokens, head_dim]")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if not math.isfinite(scale) or scale <= 0:
        raise SageArgumentError(f"scale: expected a positive finite number, got {scale!r}")
    if dispatcher_free(q, k, v):  # eager: the autograd.Function, without the dispatcher's host time
        out, lse = SageBwdFunction.apply(q, k, v, bool(is_causal), scale, forward_preset)
    else:
        out, lse = torch.ops.sagegen.sagebwd_attention(q, k, v, bool(is_causal), scale, forward_preset)
    return (out, lse) if return_lse else out
