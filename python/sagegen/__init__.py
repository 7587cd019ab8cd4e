"""sagegen from Python: quantized attention kernels through the C ABI (runtime/include/sage/sage_c.h).

Works with any CUDA tensor that has data_ptr()/stride()/shape (PyTorch) - nothing is built against
PyTorch. The shared library is found through $SAGEGEN_LIBRARY, else build*/runtime/libsagegen_c.so.
"""

import ctypes
import glob
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


class SageError(RuntimeError):
    """A sagegen call failed; the message names the argument and what was expected."""


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("batch_stride", ctypes.c_longlong),
                ("head_stride", ctypes.c_longlong), ("token_stride", ctypes.c_longlong)]


class _Shape(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_longlong), ("heads_q", ctypes.c_longlong), ("heads_kv", ctypes.c_longlong),
                ("tokens_q", ctypes.c_longlong), ("tokens_kv", ctypes.c_longlong)]


PHASE_ALL, PHASE_PROLOGUE, PHASE_ATTENTION = 0, 1, 2


def _find_library():
    explicit = os.environ.get("SAGEGEN_LIBRARY")
    if explicit:
        return explicit
    root = os.path.dirname(os.path.dirname(_HERE))
    for candidate in sorted(glob.glob(os.path.join(root, "build*", "runtime", "libsagegen_c.so"))):
        return candidate
    raise SageError("libsagegen_c.so not found: build the project or set SAGEGEN_LIBRARY")


def _load():
    library = ctypes.CDLL(_find_library())
    library.sage_last_error.restype = ctypes.c_char_p
    library.sage_version.restype = ctypes.c_char_p
    library.sage_attention_create_preset.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                     ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    library.sage_attention_create_preset_tuned.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                          ctypes.c_char_p, ctypes.c_char_p,
                                                          ctypes.POINTER(ctypes.c_void_p)]
    library.sage_attention_create_ir.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    library.sage_attention_destroy.argtypes = [ctypes.c_void_p]
    library.sage_attention_workspace_bytes.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Shape),
                                                       ctypes.POINTER(ctypes.c_size_t)]
    library.sage_attention_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Shape), _Tensor, _Tensor,
                                           _Tensor, _Tensor, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_size_t, ctypes.c_void_p]
    library.sage_attention_describe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    return library


_library = None


def library():
    global _library
    if _library is None:
        _library = _load()
    return _library


def _check(status):
    if status != 0:
        raise SageError(library().sage_last_error().decode())


def _view(tensor, layout):
    """(b, h, n, d) strides of a 4-D tensor stored as HND ([b, h, n, d]) or NHD ([b, n, h, d])."""
    if len(tensor.shape) != 4:
        raise SageError(f"expected a 4-D tensor, got shape {tuple(tensor.shape)}")
    if tensor.stride(-1) != 1:
        raise SageError("the head dim must be contiguous (stride 1)")
    stride = tensor.stride()
    if layout == "HND":
        return _Tensor(tensor.data_ptr(), stride[0], stride[1], stride[2])
    if layout == "NHD":
        return _Tensor(tensor.data_ptr(), stride[0], stride[2], stride[1])
    raise SageError(f"layout: expected 'HND' or 'NHD', got {layout!r}")


def _heads_tokens(tensor, layout):
    return (tensor.shape[1], tensor.shape[2]) if layout == "HND" else (tensor.shape[2], tensor.shape[1])


class Attention:
    """One compiled variant. Call it with q, k, v (f16/bf16 CUDA tensors, HND or NHD)."""

    def __init__(self, preset="sage-b", head_dim=128, causal=False, lse=False, dtype="f16", ir=None, tunables=None):
        handle = ctypes.c_void_p()
        if ir is not None:
            _check(library().sage_attention_create_ir(ir.encode(), dtype.encode(), ctypes.byref(handle)))
        else:
            _check(library().sage_attention_create_preset_tuned(preset.encode(), head_dim, int(causal), int(lse),
                                                                dtype.encode(), (tunables or "").encode(),
                                                                ctypes.byref(handle)))
        self._handle = handle
        self.write_lse = lse
        self._workspace = None

    def __del__(self):
        if getattr(self, "_handle", None):
            library().sage_attention_destroy(self._handle)
            self._handle = None

    def describe(self):
        buffer = ctypes.create_string_buffer(4096)
        _check(library().sage_attention_describe(self._handle, buffer, len(buffer)))
        return buffer.value.decode()

    def __call__(self, q, k, v, layout="HND", phase=PHASE_ALL, out=None, lse=None, block_mask=None, stream=None):
        import torch  # only for allocation; the kernels see raw pointers

        heads_q, tokens_q = _heads_tokens(q, layout)
        heads_kv, tokens_kv = _heads_tokens(k, layout)
        shape = _Shape(q.shape[0], heads_q, heads_kv, tokens_q, tokens_kv)
        if out is None:
            out = torch.empty_like(q)
        if self.write_lse and lse is None:
            lse = torch.empty((q.shape[0], heads_q, tokens_q), dtype=torch.float32, device=q.device)
        needed = ctypes.c_size_t()
        _check(library().sage_attention_workspace_bytes(self._handle, ctypes.byref(shape), ctypes.byref(needed)))
        if self._workspace is None or self._workspace.numel() < needed.value:
            self._workspace = torch.empty(max(needed.value, 1), dtype=torch.uint8, device=q.device)
        stream_handle = stream if stream is not None else torch.cuda.current_stream(q.device).cuda_stream
        _check(library().sage_attention_run(
            self._handle, phase, ctypes.byref(shape), _view(q, layout), _view(k, layout), _view(v, layout),
            _view(out, layout), lse.data_ptr() if lse is not None else None,
            block_mask.data_ptr() if block_mask is not None else None, self._workspace.data_ptr(),
            self._workspace.numel(), stream_handle))
        return (out, lse) if self.write_lse else out
