"""SLA (sparse-linear attention, issue 13) in PyTorch: an autograd function over the C ABI's SLA forward and backward
(runtime/include/sage/sage_sla_c.h), and a module whose Proj is an ordinary torch.nn.Linear that the caller owns.

    proj = torch.nn.Linear(128, 128)                       # trained with the model
    sla = sagegen.SparseLinearAttention(128, proj, critical_percent=5, negligible_percent=10)
    out = sla(q, k, v)                                     # f16 or bf16 [b, h, n, d] (HND); out.backward(...) works

The kernels return O^s (critical blocks, exact or quantized as the preset says) and O^l (the linear branch over the
marginal blocks) apart; the module adds proj(O^l), so autograd differentiates Proj and hands the kernels dO^s and
dO^l (Algorithm 2). The backward is that of the exact formula with the predicted classes held fixed; it is handed the
forward's O^s, so that with an exact sparse part (sla-f16, sla-f16-elu) it reuses the L the forward saved in the
workspace and forms D^s from O^s instead of recomputing the sparse part's statistics (sla-int8 recomputes them).
"""

import ctypes
import weakref

from ._library import DTYPE_BF16, DTYPE_F16, SageArgumentError, TensorDesc, check, library
from ._tensors import describe

_FEATURE_MAPS = {"softmax": 0, "elu_plus_one": 1, "relu": 2}
_DTYPES = {"f16": DTYPE_F16, "bf16": DTYPE_BF16}


class SlaConfig(ctypes.Structure):
    _fields_ = [("preset", ctypes.c_char_p), ("head_dim", ctypes.c_int), ("critical_percent", ctypes.c_double),
                ("negligible_percent", ctypes.c_double), ("feature_map", ctypes.c_int), ("device", ctypes.c_int),
                ("dtype", ctypes.c_int)]


class SlaArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.POINTER(TensorDesc)) for name in
                ("q", "k", "v", "o_sparse", "o_linear", "d_sparse", "d_linear", "dq", "dk", "dv")] + [
        ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t), ("stream", ctypes.c_void_p)]


def _declare_sla(lib):
    if getattr(lib, "_sla_declared", False):
        return lib
    lib.sage_sla_create.argtypes = [ctypes.POINTER(SlaConfig), ctypes.POINTER(ctypes.c_void_p)]
    lib.sage_sla_destroy.argtypes = [ctypes.c_void_p]
    lib.sage_sla_workspace.argtypes = [ctypes.c_void_p, ctypes.POINTER(TensorDesc), ctypes.POINTER(TensorDesc),
                                       ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]
    lib.sage_sla_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(SlaArgs)]
    lib.sage_sla_backward.argtypes = [ctypes.c_void_p, ctypes.POINTER(SlaArgs)]
    for name in ("sage_sla_create", "sage_sla_workspace", "sage_sla_forward", "sage_sla_backward"):
        getattr(lib, name).restype = ctypes.c_int
    lib._sla_declared = True
    return lib


class SlaKernels:
    """The C handle of one SLA configuration on one device for one dtype ("f16" or "bf16": q, k, v and O^s)."""

    def __init__(self, preset, head_dim, critical_percent, negligible_percent, feature_map, device, dtype="f16"):
        if feature_map is not None and feature_map not in _FEATURE_MAPS:
            raise SageArgumentError(f"feature_map: expected one of {sorted(_FEATURE_MAPS)} or None, got {feature_map!r}")
        if dtype not in _DTYPES:
            raise SageArgumentError(f"dtype: expected one of {sorted(_DTYPES)}, got {dtype!r}")
        config = SlaConfig(preset.encode(), head_dim, critical_percent, negligible_percent,
                           -1 if feature_map is None else _FEATURE_MAPS[feature_map], device, _DTYPES[dtype])
        handle = ctypes.c_void_p()
        check(_declare_sla(library()).sage_sla_create(ctypes.byref(config), ctypes.byref(handle)))
        self.handle = handle
        # Not __del__ (module globals may be None at interpreter shutdown): the finalizer holds the destroy function.
        self._finalizer = weakref.finalize(self, _declare_sla(library()).sage_sla_destroy, handle)

    def workspace(self, q, k):
        """(bytes, classes offset, q_blocks, kv_blocks) of the workspace for q and k."""
        size, offset, q_blocks, kv_blocks = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_int(), ctypes.c_int()
        qd, kd = describe(q, "q"), describe(k, "k")
        check(library().sage_sla_workspace(self.handle, ctypes.byref(qd), ctypes.byref(kd), ctypes.byref(size),
                                           ctypes.byref(offset), ctypes.byref(q_blocks), ctypes.byref(kv_blocks)))
        return size.value, offset.value, q_blocks.value, kv_blocks.value

    def _call(self, function, tensors, workspace, stream):
        descs = {name: describe(tensor, name) for name, tensor in tensors.items()}
        args = SlaArgs()
        for name, desc in descs.items():
            setattr(args, name, ctypes.pointer(desc))
        args.workspace, args.workspace_bytes, args.stream = workspace.data_ptr(), workspace.numel(), stream
        check(function(self.handle, ctypes.byref(args)))

    def forward(self, q, k, v, o_sparse, o_linear, workspace, stream):
        self._call(library().sage_sla_forward, dict(q=q, k=k, v=v, o_sparse=o_sparse, o_linear=o_linear), workspace,
                   stream)

    def backward(self, q, k, v, d_sparse, d_linear, dq, dk, dv, workspace, stream, o_sparse=None):
        """o_sparse: the forward's O^s, unchanged; with an exact preset the forward saved L in the workspace, and the
        backward forms D^s from O^s instead of recomputing the sparse part's statistics. None: it recomputes them."""
        tensors = dict(q=q, k=k, v=v, d_sparse=d_sparse, d_linear=d_linear, dq=dq, dk=dk, dv=dv)
        if o_sparse is not None:
            tensors["o_sparse"] = o_sparse
        self._call(library().sage_sla_backward, tensors, workspace, stream)


def _torch_parts():
    import torch

    class SlaFunction(torch.autograd.Function):
        """(q, k, v) -> (O^s in q's dtype, O^l f32); the backward takes dO^s and dO^l (Algorithm 2)."""

        @staticmethod
        def forward(ctx, q, k, v, kernels):
            q, k, v = (t.contiguous() for t in (q, k, v))
            size, offset, q_blocks, kv_blocks = kernels.workspace(q, k)
            workspace = torch.empty(size, dtype=torch.uint8, device=q.device)
            o_sparse = torch.empty_like(q)
            o_linear = torch.empty(q.shape, dtype=torch.float32, device=q.device)
            stream = torch.cuda.current_stream(q.device).cuda_stream
            kernels.forward(q, k, v, o_sparse, o_linear, workspace, stream)
            # O^s too (an output: autograd refuses the backward if the caller changed it in place).
            ctx.save_for_backward(q, k, v, workspace, o_sparse)
            ctx.kernels = kernels
            ctx.classes = (offset, q_blocks, kv_blocks)
            ctx.mark_non_differentiable(workspace)
            # The workspace's gradient is never used: without this the engine would fill a zero tensor of the
            # workspace's size (the linear branch's states: hundreds of MB at N = 32k) on every backward.
            ctx.set_materialize_grads(False)
            return o_sparse, o_linear, workspace

        @staticmethod
        def backward(ctx, d_sparse, d_linear, _):
            q, k, v, workspace, o_sparse = ctx.saved_tensors
            d_sparse = torch.zeros_like(q, dtype=torch.float32) if d_sparse is None else d_sparse.float().contiguous()
            d_linear = torch.zeros_like(q, dtype=torch.float32) if d_linear is None else d_linear.float().contiguous()
            dq = torch.empty(q.shape, dtype=torch.float32, device=q.device)
            dk = torch.empty(k.shape, dtype=torch.float32, device=q.device)
            dv = torch.empty(v.shape, dtype=torch.float32, device=q.device)
            stream = torch.cuda.current_stream(q.device).cuda_stream
            ctx.kernels.backward(q, k, v, d_sparse, d_linear, dq, dk, dv, workspace, stream, o_sparse=o_sparse)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None

    class SparseLinearAttention(torch.nn.Module):
        """O = O^s + proj(O^l). `proj`: the caller's torch.nn.Linear(head_dim, head_dim) (a new one if None).
        q, k, v: f16 or bf16 (all three alike) [batch, heads, tokens, head_dim] on one CUDA device (GQA: heads_q a
        multiple of heads_kv). O, and the gradients of q, k, v, come in that dtype; Proj runs in its own (O^l is cast to
        proj.weight's dtype, its output to q's)."""

        def __init__(self, head_dim, proj=None, preset="sla-f16", critical_percent=5.0, negligible_percent=10.0,
                     feature_map=None):
            super().__init__()
            self.head_dim, self.preset, self.feature_map = head_dim, preset, feature_map
            self.critical_percent, self.negligible_percent = float(critical_percent), float(negligible_percent)
            self.proj = proj if proj is not None else torch.nn.Linear(head_dim, head_dim)
            self._kernels = {}
            self.last_classes = None  # M_c of the last call, int8 [b, h_q, q_blocks, kv_blocks]

        def kernels(self, device, dtype=torch.float16):
            """The kernels for `device` and `dtype` (torch.float16 or torch.bfloat16), made on first use."""
            index = device.index if device.index is not None else torch.cuda.current_device()
            key = (index, dtype)
            if key not in self._kernels:
                self._kernels[key] = SlaKernels(self.preset, self.head_dim, self.critical_percent,
                                                self.negligible_percent, self.feature_map, index,
                                                "bf16" if dtype == torch.bfloat16 else "f16")
            return self._kernels[key]

        def forward(self, q, k, v):
            if q.dtype not in (torch.float16, torch.bfloat16):
                raise SageArgumentError(f"q: the SLA kernels take float16 or bfloat16 tensors, got {q.dtype}")
            for name, tensor in (("k", k), ("v", v)):
                if tensor.dtype != q.dtype:
                    raise SageArgumentError(f"{name}: expected q's dtype ({q.dtype}), got {tensor.dtype}")
            kernels = self.kernels(q.device, q.dtype)
            o_sparse, o_linear, workspace = SlaFunction.apply(q, k, v, kernels)
            offset, q_blocks, kv_blocks = kernels.workspace(q, k)[1:]
            count = q.shape[0] * q.shape[1] * q_blocks * kv_blocks
            self.last_classes = workspace[offset:offset + count].view(torch.int8).view(
                q.shape[0], q.shape[1], q_blocks, kv_blocks)
            return o_sparse + self.proj(o_linear.to(self.proj.weight.dtype)).to(o_sparse.dtype)

    return SlaFunction, SparseLinearAttention


def __getattr__(name):
    if name in ("SlaFunction", "SparseLinearAttention"):
        function, module = _torch_parts()
        globals().update(SlaFunction=function, SparseLinearAttention=module)
        return globals()[name]
    raise AttributeError(name)
