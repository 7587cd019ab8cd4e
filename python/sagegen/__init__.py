"""sagegen from Python: quantized attention kernels through the C ABI (runtime/include/sage/sage_c.h).

    import sagegen
    out = sagegen.sageattn(q, k, v, tensor_layout="HND", is_causal=True)   # SageAttention's signature
    attention = sagegen.Attention("sage-b", head_dim=128, causal=True)   # one variant, any device and dtype
    with sagegen.sdpa():                                                 # F.scaled_dot_product_attention -> sagegen
        y = model(x)

Nothing is built against PyTorch: libsagegen_c.so is loaded with ctypes (found next to this package after
`pip install ./python`, in an install prefix, or in the checkout's build*/), and tensors are passed as validated
descriptions (pointer, shape, strides, dtype, device). Every bad input raises SageArgumentError naming the argument.
With PyTorch present, `torch.ops.sagegen.attention` is a torch.library custom op (torch.compile, CUDA graphs).
"""

import ctypes
import threading
import weakref

from ._library import (BOTTOM_RIGHT, CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, DTYPE_F32, DTYPE_U8, PHASE_ALL,
                       PHASE_ATTENTION, PHASE_PROLOGUE, TOP_LEFT, AttentionConfig, RunArgs, SageArgumentError,
                       SageError, SageUnsupportedError, TensorDesc, VarlenArgs, check, library)
from ._tensors import DTYPE_NAMES, describe, heads_tokens, layout_code

__all__ = ["Attention", "SageError", "SageArgumentError", "SageUnsupportedError", "sageattn", "sageattn_varlen", "sdpa",
           "version",
           "sagebwd_attention",
           "PHASE_ALL", "PHASE_PROLOGUE", "PHASE_ATTENTION", "BOTTOM_RIGHT", "TOP_LEFT"]

_ALIGNMENTS = {BOTTOM_RIGHT: CAUSAL_BOTTOM_RIGHT, TOP_LEFT: CAUSAL_TOP_LEFT}
_DTYPE_ARGUMENT = {None: None, "f16": 1, "bf16": 2}


def version():
    return library().sage_version().decode()


def _alignment_code(causal_alignment):
    if causal_alignment not in _ALIGNMENTS:
        raise SageArgumentError(f"causal_alignment: expected {BOTTOM_RIGHT!r} or {TOP_LEFT!r}, "
                                f"got {causal_alignment!r}")
    return _ALIGNMENTS[causal_alignment]


class _Runner:
    """One C handle: a variant's kernels for one device and dtype."""

    def __init__(self, config):
        loaded = library()
        handle = ctypes.c_void_p()
        check(loaded.sage_attention_create(ctypes.byref(config), ctypes.byref(handle)))
        self.handle = handle
        # Not __del__ (module globals may be None at interpreter shutdown): the finalizer holds the destroy function.
        self._finalizer = weakref.finalize(self, loaded.sage_attention_destroy, handle)
        self._workspace_sizes = {}  # (layout, q shape, k shape) -> bytes: one library call per shape, not per call

    def varlen_workspace_bytes(self, batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_k):
        key = ("varlen", batch, heads_q, heads_kv, max_seqlen_q, max_seqlen_k)
        needed = self._workspace_sizes.get(key)
        if needed is None:
            loaded = library()
            if not hasattr(loaded, "sage_attention_run_varlen"):
                raise SageUnsupportedError("cu_seqlens_q: this libsagegen_c.so has no variable-length calls; rebuild")
            size = ctypes.c_size_t()
            check(loaded.sage_attention_varlen_workspace_bytes(self.handle, batch, heads_q, heads_kv, max_seqlen_q,
                                                               max_seqlen_k, ctypes.byref(size)))
            if len(self._workspace_sizes) >= 1024:
                self._workspace_sizes.clear()
            needed = self._workspace_sizes[key] = size.value
        return needed

    def workspace_bytes(self, layout_value, q_desc, k_desc):
        key = (layout_value, tuple(q_desc.shape), tuple(k_desc.shape))
        needed = self._workspace_sizes.get(key)
        if needed is None:
            size = ctypes.c_size_t()
            check(library().sage_attention_workspace_bytes(self.handle, layout_value, ctypes.byref(q_desc),
                                                           ctypes.byref(k_desc), ctypes.byref(size)))
            if len(self._workspace_sizes) >= 1024:  # many shapes (varying lengths): bounded, not a leak
                self._workspace_sizes.clear()
            needed = self._workspace_sizes[key] = size.value
        return needed


class _Plan:
    """One shape of call, prebuilt (issue 24: host time per call): the descriptions and RunArgs for a (layout,
    phase, tensors' shapes, strides, dtypes and devices) seen before, so that a repeated call only writes its data
    pointers, workspace and stream. What Python checks depends only on what the key holds and was checked when the
    plan was made; the library checks every call again in full."""

    __slots__ = ("runner", "device", "torch_device", "descs", "lse_desc", "mask_desc", "lse_shape", "args",
                 "args_ref", "workspace_needed")


def _signature(tensor):
    """What a tensor's description depends on besides its data pointer (AttributeError/TypeError: not a tensor)."""
    return None if tensor is None else (tensor.shape, tensor.stride(), tensor.dtype, tensor.device)


def _contiguous_desc(shape, dtype, device):
    """The description of torch.empty(shape): what a plan's allocated out and lse look like, before they exist."""
    desc = TensorDesc()
    desc.ndim = len(shape)
    step, strides = 1, []
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    desc.shape[:desc.ndim], desc.strides[:desc.ndim] = list(shape), strides
    desc.dtype, desc.device = dtype, device
    return desc


_PLANS_PER_THREAD = 256  # bounded: many shapes (varying lengths) clear the cache rather than grow it

# Bound calls whose workspace is small share one per (device, stream), kept between calls: an allocation per call
# costs ~3.5 us of host time (H200 run 46), as much as the kernels of a call that small. Allocated on its stream and
# used only there (stream order: never reused under a kernel still reading it); never during CUDA-graph capture (a
# graph gets its own from the graph's pool). At most 16 streams x 8 MiB are held.
_SMALL_WORKSPACE_BYTES = 8 << 20
_SMALL_WORKSPACE_STREAMS = 16
_small_workspaces = {}  # (device, stream handle) -> (uint8 tensor, its bytes)


def _small_workspace(torch, device, stream, needed):
    """The held workspace of this device and stream (grown to `needed` bytes), or None where none is held: during
    capture, or beyond _SMALL_WORKSPACE_STREAMS streams. The current stream and device are `stream` and `device`."""
    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
    if capturing() if capturing is not None else torch.cuda.is_current_stream_capturing():
        return None
    key = (device, stream)
    held = _small_workspaces.get(key)
    if held is not None and held[1] >= needed:
        return held[0]
    if held is None and len(_small_workspaces) >= _SMALL_WORKSPACE_STREAMS:
        return None
    workspace = torch.empty(needed, dtype=torch.uint8, device=device)
    _small_workspaces[key] = (workspace, needed)
    return workspace


_torch_module = None


def _load_torch():
    global _torch_module
    if _torch_module is None:
        import torch  # allocation and streams only; the kernels see validated descriptions
        _torch_module = torch
    return _torch_module


def _current_raw_stream(torch, device):
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the handle without a Stream object
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def _current_device(torch):
    get = getattr(torch._C, "_cuda_getDevice", None)
    return get() if get is not None else torch.cuda.current_device()


def _bound_outputs(torch, plan, q):
    """A bound call's per-call allocations: a function that allocates out (q's shape and dtype), lse (when the plan
    has its shape) and the workspace (the stream's held one when small: _small_workspace; else from the caching
    allocator on the current stream), writes their pointers, the workspace and the stream into the plan's args and
    returns (out, lse or None). Run with q's device current."""
    args, o_desc, lse_desc = plan.args, plan.descs[3], plan.lse_desc
    lse_shape, device, torch_device, needed = plan.lse_shape, plan.device, plan.torch_device, plan.workspace_needed
    empty, uint8, f32, dtype, shape = torch.empty, torch.uint8, torch.float32, q.dtype, tuple(q.shape)
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    small = needed <= _SMALL_WORKSPACE_BYTES

    def prepare():
        stream = raw_stream(device) if raw_stream is not None else torch.cuda.current_stream(device).cuda_stream
        out = empty(shape, dtype=dtype, device=torch_device)
        workspace = _small_workspace(torch, device, stream, needed) if small else None
        if workspace is None:
            workspace = empty(needed, dtype=uint8, device=torch_device)
        o_desc.data = out.data_ptr()
        lse = None
        if lse_shape is not None:
            lse = empty(lse_shape, dtype=f32, device=torch_device)
            lse_desc.data = lse.data_ptr()
        args.workspace, args.workspace_bytes, args.stream = workspace.data_ptr(), needed, stream
        return out, lse

    return prepare


def _on_device(torch, device, launch):
    """`launch` run with `device` current (the current stream and allocations are its)."""
    def call(*tensors):
        if _current_device(torch) == device:
            return launch(*tensors)
        with torch.cuda.device(device):
            return launch(*tensors)
    return call


class Attention:
    """One attention variant, runnable on any CUDA device with f16 or bf16 tensors.

    Kernels are built per (device, dtype) on first use: a call with tensors on device 1 runs device 1's kernels.
    dtype: None (follow the tensors), "f16" or "bf16" (then other tensors are refused). causal_alignment: how a
    causal mask lines up when tokens_q != tokens_kv ("bottom-right" as FlashAttention, "top-left" as PyTorch SDPA).
    Calls are planned: the first call of a shape (shapes, strides, dtypes, devices, layout, phase) is checked and
    described in full; a repeated one reuses that work and only passes its new data pointers, workspace and stream.
    """

    def __init__(self, preset="sage-b", head_dim=128, causal=False, lse=False, dtype=None, ir=None, tunables=None,
                 causal_alignment=BOTTOM_RIGHT):
        if dtype not in _DTYPE_ARGUMENT:
            raise SageArgumentError(f"dtype: expected None, 'f16' or 'bf16', got {dtype!r}")
        if ir is None and not isinstance(preset, str):
            raise SageArgumentError(f"preset: expected a preset name, got {preset!r}")
        if not isinstance(head_dim, int) or head_dim <= 0:
            raise SageArgumentError(f"head_dim: expected a positive int, got {head_dim!r}")
        self.preset, self.ir, self.head_dim, self.causal = preset, ir, head_dim, bool(causal)
        self.write_lse, self.tunables, self.dtype = bool(lse), tunables or "", dtype
        self.causal_alignment = causal_alignment
        self._alignment = _alignment_code(causal_alignment)
        self._runners = {}
        self._workspaces = {}  # (device, stream handle) -> uint8 tensor, allocated on that stream
        self._workspace_sizes = {}  # (layout, q's and k's signatures) -> bytes
        self._local = threading.local()  # .plans: this thread's plans (a plan's RunArgs are written per call)
        self._lock = threading.Lock()

    def _runner(self, device, dtype):
        key = (device, dtype)
        runner = self._runners.get(key)
        if runner is None:
            expected = _DTYPE_ARGUMENT[self.dtype]
            if expected is not None and dtype != expected:
                raise SageArgumentError(f"q: expected dtype {self.dtype} (this Attention's dtype), got "
                                        f"{DTYPE_NAMES.get(dtype, dtype)}")
            if dtype not in DTYPE_NAMES:
                raise SageArgumentError("q: expected dtype float16 or bfloat16")
            config = AttentionConfig()
            config.preset = None if self.ir is not None else self.preset.encode()
            config.ir_text = self.ir.encode() if self.ir is not None else None
            config.head_dim, config.causal, config.write_lse = self.head_dim, int(self.causal), int(self.write_lse)
            config.dtype, config.tunables, config.device = dtype, self.tunables.encode(), device
            with self._lock:
                runner = self._runners.get(key) or _Runner(config)
                self._runners[key] = runner
        return runner

    def describe(self, device=0, dtype="f16"):
        buffer = ctypes.create_string_buffer(4096)
        check(library().sage_attention_describe(self._runner(device, _DTYPE_ARGUMENT[dtype]).handle, buffer,
                                                len(buffer)))
        return buffer.value.decode()

    def block_sizes(self, device=0, dtype="f16"):
        """(block_q, block_kv): the granularity of block_mask."""
        block_q, block_kv = ctypes.c_int(), ctypes.c_int()
        check(library().sage_attention_block_sizes(self._runner(device, _DTYPE_ARGUMENT[dtype]).handle,
                                                   ctypes.byref(block_q), ctypes.byref(block_kv)))
        return block_q.value, block_kv.value

    def workspace_bytes(self, q, k, layout="HND"):
        try:
            key = (layout, _signature(q), _signature(k))
            needed = self._workspace_sizes.get(key)
        except (AttributeError, TypeError):  # not tensors: the checks below say which
            key, needed = None, None
        if needed is None:
            layout_value = layout_code(layout)
            q_desc, k_desc = describe(q, "q"), describe(k, "k")
            if q_desc.device < 0:
                raise SageArgumentError("q: is in host memory, expected a CUDA tensor")
            needed = self._runner(q_desc.device, q_desc.dtype).workspace_bytes(layout_value, q_desc, k_desc)
            if key is not None:
                if len(self._workspace_sizes) >= 1024:
                    self._workspace_sizes.clear()
                self._workspace_sizes[key] = needed
        return needed

    def _plan(self, q, k, v, layout, phase, out, lse, block_mask, workspace):
        """Every check Python makes, then the descriptions and RunArgs; raises SageArgumentError naming the argument."""
        layout_value = layout_code(layout)
        if phase not in (PHASE_ALL, PHASE_PROLOGUE, PHASE_ATTENTION):
            raise SageArgumentError(f"phase: expected PHASE_ALL, PHASE_PROLOGUE or PHASE_ATTENTION, got {phase!r}")
        q_desc = describe(q, "q")
        if q_desc.device < 0:
            raise SageArgumentError("q: is in host memory, expected a CUDA tensor")
        device = q_desc.device
        batch, heads_q, tokens_q, _ = heads_tokens(q, layout, "q")
        runner = self._runner(device, q_desc.dtype)
        k_desc, v_desc = describe(k, "k"), describe(v, "v")
        o_desc = describe(out, "o") if out is not None else _contiguous_desc(tuple(q.shape), q_desc.dtype, device)
        plan = _Plan()
        plan.lse_shape = None
        if lse is not None:
            plan.lse_desc = describe(lse, "lse")
        elif self.write_lse:
            plan.lse_shape = (batch, heads_q, tokens_q)
            plan.lse_desc = _contiguous_desc(plan.lse_shape, DTYPE_F32, device)
        else:
            plan.lse_desc = None
        plan.mask_desc = describe(block_mask, "block_mask") if block_mask is not None else None
        if workspace is None:
            plan.workspace_needed = runner.workspace_bytes(layout_value, q_desc, k_desc)
        else:  # its size is the library's to check
            ws = describe(workspace, "workspace")
            if ws.device != device or ws.dtype != DTYPE_U8 or ws.ndim != 1:
                raise SageArgumentError(f"workspace: expected a 1-D uint8 tensor on CUDA device {device}")
            plan.workspace_needed = None
        args = RunArgs()
        args.layout, args.phase, args.causal_alignment = layout_value, phase, self._alignment
        args.q, args.k, args.v, args.o = (ctypes.pointer(desc) for desc in (q_desc, k_desc, v_desc, o_desc))
        if plan.lse_desc is not None:
            args.lse = ctypes.pointer(plan.lse_desc)
        if plan.mask_desc is not None:
            args.block_mask = ctypes.pointer(plan.mask_desc)
        plan.runner, plan.device, plan.torch_device = runner, device, q.device
        plan.descs, plan.args, plan.args_ref = (q_desc, k_desc, v_desc, o_desc), args, ctypes.byref(args)
        return plan

    def __call__(self, q, k, v, layout="HND", phase=PHASE_ALL, out=None, lse=None, block_mask=None, stream=None,
                 workspace=None):
        """out (and lse when built with lse=True), allocated when not given. stream: a torch.cuda.Stream of q's
        device (default: its current stream). workspace: a uint8 CUDA tensor of at least workspace_bytes(q, k)
        (default: one per device and stream, kept by this object, allocated on that stream)."""
        torch = _load_torch()
        plans = getattr(self._local, "plans", None)
        if plans is None:
            plans = self._local.plans = {}
        try:
            key = (layout, phase, q.shape, q.stride(), q.dtype, q.device, _signature(k), _signature(v),
                   _signature(out), _signature(lse), _signature(block_mask), _signature(workspace))
            plan = plans.get(key)
        except (AttributeError, TypeError):  # not tensors, or unhashable stand-ins: the full checks say which
            key, plan = None, None
        if plan is None:
            plan = self._plan(q, k, v, layout, phase, out, lse, block_mask, workspace)
            if key is not None:
                if len(plans) >= _PLANS_PER_THREAD:
                    plans.clear()
                plans[key] = plan
        if stream is not None and getattr(stream, "device", q.device) != q.device:
            raise SageArgumentError(f"stream: is on {stream.device}, expected q's device {q.device}")
        if _current_device(torch) == plan.device:
            out, lse = self._run(torch, plan, q, k, v, out, lse, block_mask, stream, workspace)
        else:
            with torch.cuda.device(plan.device):  # the guard: the current stream, capture state are q's device's
                out, lse = self._run(torch, plan, q, k, v, out, lse, block_mask, stream, workspace)
        return (out, lse) if self.write_lse else out

    def _run(self, torch, plan, q, k, v, out, lse, block_mask, stream, workspace):
        stream_handle = _current_raw_stream(torch, plan.device) if stream is None else stream.cuda_stream
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=plan.torch_device)
        if lse is None and plan.lse_shape is not None:
            lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.torch_device)
        if workspace is None:
            workspace = self._workspace(stream, stream_handle, plan.device, plan.workspace_needed, torch)
        q_desc, k_desc, v_desc, o_desc = plan.descs
        q_desc.data, k_desc.data, v_desc.data, o_desc.data = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
        if plan.lse_desc is not None:
            plan.lse_desc.data = lse.data_ptr()
        if plan.mask_desc is not None:
            plan.mask_desc.data = block_mask.data_ptr()
        args = plan.args
        args.workspace, args.workspace_bytes, args.stream = workspace.data_ptr(), workspace.numel(), stream_handle
        check(library().sage_attention_run(plan.runner.handle, plan.args_ref))
        return out, lse

    def _varlen_plan(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, workspace,
                     stream):
        """Every check Python makes of a packed call, then its descriptions and VarlenArgs (out and lse described
        when given, else as the contiguous tensors a call allocates). Returns a _Plan whose descs are q, k, v, o,
        cu_seqlens_q, cu_seqlens_k."""
        q_desc = describe(q, "q")
        if q_desc.device < 0:
            raise SageArgumentError("q: is in host memory, expected a CUDA tensor")
        if q_desc.ndim != 3:
            raise SageArgumentError(f"q: expected a 3-D tensor [total_q, heads_q, head_dim], got shape "
                                    f"{tuple(q_desc.shape[:q_desc.ndim])}")
        device = q_desc.device
        runner = self._runner(device, q_desc.dtype)
        k_desc, v_desc = describe(k, "k"), describe(v, "v")
        cu_q_desc, cu_k_desc = describe(cu_seqlens_q, "cu_seqlens_q"), describe(cu_seqlens_k, "cu_seqlens_k")
        if k_desc.ndim != 3:
            raise SageArgumentError(f"k: expected a 3-D tensor [total_k, heads_kv, head_dim], got shape "
                                    f"{tuple(k_desc.shape[:k_desc.ndim])}")
        maxima = []
        for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SageArgumentError(f"{name}: expected an int >= 1 (an upper bound of the lengths), got {value!r}")
            maxima.append(value)
        total_q, heads_q = q_desc.shape[0], q_desc.shape[1]
        plan = _Plan()
        plan.workspace_needed = None
        if workspace is None:
            plan.workspace_needed = runner.varlen_workspace_bytes(cu_q_desc.shape[0] - 1, heads_q, k_desc.shape[1],
                                                                  *maxima)
        else:
            ws = describe(workspace, "workspace")
            if ws.device != device or ws.dtype != DTYPE_U8 or ws.ndim != 1:
                raise SageArgumentError(f"workspace: expected a 1-D uint8 tensor on CUDA device {device}")
        if stream is not None and getattr(stream, "device", q.device) != q.device:
            raise SageArgumentError(f"stream: is on {stream.device}, expected q's device {q.device}")
        o_desc = describe(out, "o") if out is not None else _contiguous_desc(tuple(q.shape), q_desc.dtype, device)
        plan.lse_shape = (heads_q, total_q) if self.write_lse else None
        plan.lse_desc = describe(lse, "lse") if lse is not None else \
            _contiguous_desc(plan.lse_shape, DTYPE_F32, device) if self.write_lse else None
        plan.mask_desc = None
        args = VarlenArgs()
        args.causal_alignment = self._alignment
        args.q, args.k, args.v, args.o = (ctypes.pointer(desc) for desc in (q_desc, k_desc, v_desc, o_desc))
        if plan.lse_desc is not None:
            args.lse = ctypes.pointer(plan.lse_desc)
        args.cu_seqlens_q, args.cu_seqlens_kv = ctypes.pointer(cu_q_desc), ctypes.pointer(cu_k_desc)
        args.max_seqlen_q, args.max_seqlen_kv = maxima
        plan.runner, plan.device, plan.torch_device = runner, device, q.device
        plan.descs = (q_desc, k_desc, v_desc, o_desc, cu_q_desc, cu_k_desc)
        plan.args, plan.args_ref = args, ctypes.byref(args)
        return plan

    def varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out=None, lse=None,
               stream=None, workspace=None):
        """A packed (variable-length) call, FlashAttention's varlen convention: q [total_q, h_q, d], k/v [total_k,
        h_kv, d], cu_seqlens_q / cu_seqlens_k int32 [batch + 1] on q's device, max_seqlen_q / max_seqlen_k (ints)
        >= every length. Sequence b (rows cu[b] .. cu[b + 1] - 1) is attended alone, as a dense call of it would be;
        causal masks align per sequence by this object's causal_alignment (bottom-right: FlashAttention's). Returns
        out [total_q, h_q, d] (and lse f32 [h_q, total_q] when built with lse=True). The offsets' values are the
        caller's to get right (sageattn_varlen checks them in eager mode); the library checks every descriptor."""
        torch = _load_torch()
        plan = self._varlen_plan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse,
                                 workspace, stream)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if lse is None and plan.lse_shape is not None:
            lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=q.device)
        q_desc, k_desc, v_desc, o_desc, cu_q_desc, cu_k_desc = plan.descs
        o_desc.data = out.data_ptr()
        if lse is not None:
            plan.lse_desc.data = lse.data_ptr()
        device, args = plan.device, plan.args

        def launch():
            stream_handle = _current_raw_stream(torch, device) if stream is None else stream.cuda_stream
            space = workspace if workspace is not None else self._workspace(stream, stream_handle, device,
                                                                            plan.workspace_needed, torch)
            args.workspace, args.workspace_bytes, args.stream = space.data_ptr(), space.numel(), stream_handle
            check(library().sage_attention_run_varlen(plan.runner.handle, plan.args_ref))

        if _current_device(torch) == device:
            launch()
        else:
            with torch.cuda.device(device):  # the current stream and capture state are q's device's
                launch()
        return (out, lse) if self.write_lse else out

    def bound_call(self, q, k, v, layout="HND"):
        """A function f(q, k, v) -> (out, lse or None) for repeated calls with tensors like these (their shapes,
        strides, dtypes and device), for one thread: this call's checks and plan made once, and per call only the
        allocations (out, lse, and a workspace from PyTorch's caching allocator on the current stream, or for a small
        one the stream's held workspace: _small_workspace), the data pointers and the C call (which checks everything
        again). The caller keys it by the tensors' signatures; a call with other tensors is the library's to refuse."""
        torch = _load_torch()
        needed = max(self.workspace_bytes(q, k, layout), 1)
        plan = self._plan(q, k, v, layout, PHASE_ALL, None, None, None,
                          torch.empty(needed, dtype=torch.uint8, device=q.device))
        plan.workspace_needed = needed
        q_desc, k_desc, v_desc, o_desc = plan.descs
        prepare = _bound_outputs(torch, plan, q)
        run, handle, args_ref = library().sage_attention_run, plan.runner.handle, plan.args_ref

        def launch(q, k, v):
            out, lse = prepare()
            q_desc.data, k_desc.data, v_desc.data = q.data_ptr(), k.data_ptr(), v.data_ptr()
            check(run(handle, args_ref))
            return out, lse

        return _on_device(torch, plan.device, launch)

    def bound_varlen(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        """bound_call for packed calls: f(q, k, v, cu_seqlens_q, cu_seqlens_k) -> (out, lse or None) for repeated
        calls with tensors like these (shapes, strides, dtypes, device) and these maxima, for one thread. Per call:
        the allocations, the data pointers and the C call (which checks every descriptor again, never the offsets'
        values)."""
        torch = _load_torch()
        plan = self._varlen_plan(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, None, None, None,
                                 None)
        plan.workspace_needed = max(plan.workspace_needed, 1)
        q_desc, k_desc, v_desc, o_desc, cu_q_desc, cu_k_desc = plan.descs
        prepare = _bound_outputs(torch, plan, q)
        run, handle, args_ref = library().sage_attention_run_varlen, plan.runner.handle, plan.args_ref

        def launch(q, k, v, cu_seqlens_q, cu_seqlens_k):
            out, lse = prepare()
            q_desc.data, k_desc.data, v_desc.data = q.data_ptr(), k.data_ptr(), v.data_ptr()
            cu_q_desc.data, cu_k_desc.data = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
            check(run(handle, args_ref))
            return out, lse

        return _on_device(torch, plan.device, launch)

    def _workspace(self, stream, stream_handle, device, needed, torch):
        # Allocated on its stream: PyTorch's caching allocator then hands a dropped (regrown) workspace only to later
        # work on the same stream, so it is never reused under a kernel still reading it. During CUDA-graph
        # capture a fresh one comes from the graph's pool instead of replacing the cached one.
        if torch.cuda.is_current_stream_capturing():
            return torch.empty(max(needed, 1), dtype=torch.uint8, device=device)
        key = (device, stream_handle)
        workspace = self._workspaces.get(key)
        if workspace is None or workspace.numel() < needed:
            with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream(device)):
                workspace = torch.empty(max(needed, 1), dtype=torch.uint8, device=device)
            self._workspaces[key] = workspace
        return workspace


from ._torch import sageattn, sdpa  # noqa: E402  (after Attention, which it uses)
from ._varlen import sageattn_varlen  # noqa: E402  (issue 28: packed variable-length batches)


def __getattr__(name):
    """SLA (issue 13, sagegen/_sla.py): SparseLinearAttention and SlaFunction need PyTorch, so they load on use."""
    if name in ("SparseLinearAttention", "SlaFunction", "SlaKernels"):
        from . import _sla
        return getattr(_sla, name)
    raise AttributeError(f"module 'sagegen' has no attribute {name!r}")
from ._backward import sagebwd_attention  # noqa: E402  (SageBwd, issue 12: after _torch's forward op)
from ._lse import merge_attention, merge_attention_into  # noqa: E402  (issue 30: the LSE merge; see sagegen.distributed)
