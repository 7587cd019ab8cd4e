"""libsagegen_c.so through ctypes: where it is found, the C ABI's declarations (runtime/include/sage/sage_c.h)."""

import ctypes
import glob
import os

ABI_VERSION = 3

_HERE = os.path.dirname(os.path.abspath(__file__))
_NAME = "libsagegen_c.so"


class SageError(RuntimeError):
    """A sagegen call failed; the message names the argument and what was expected."""


class SageArgumentError(SageError, ValueError):
    """The caller's mistake (SAGE_INVALID_ARGUMENT, or a check in Python): the message names the argument."""


class SageUnsupportedError(SageError):
    """Valid, but nothing here runs it (SAGE_UNSUPPORTED): the message says why."""


_STATUS_ERRORS = {1: SageArgumentError, 2: SageUnsupportedError}
_STATUS_NAMES = {1: "invalid argument", 2: "unsupported", 3: "compile error", 4: "CUDA error", 5: "internal error",
                 6: "out of memory"}

DTYPE_F16, DTYPE_BF16, DTYPE_F32, DTYPE_U8, DTYPE_BOOL, DTYPE_I32 = 1, 2, 3, 4, 5, 6
LAYOUT_HND, LAYOUT_NHD = 0, 1
CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT = 0, 1
PHASE_ALL, PHASE_PROLOGUE, PHASE_ATTENTION = 0, 1, 2
HOST_MEMORY = -1
BOTTOM_RIGHT, TOP_LEFT = "bottom-right", "top-left"  # causal alignments, by name


class TensorDesc(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("ndim", ctypes.c_int), ("shape", ctypes.c_longlong * 4),
                ("strides", ctypes.c_longlong * 4), ("dtype", ctypes.c_int), ("device", ctypes.c_int)]


class AttentionConfig(ctypes.Structure):
    _fields_ = [("preset", ctypes.c_char_p), ("ir_text", ctypes.c_char_p), ("head_dim", ctypes.c_int),
                ("causal", ctypes.c_int), ("write_lse", ctypes.c_int), ("dtype", ctypes.c_int),
                ("tunables", ctypes.c_char_p), ("device", ctypes.c_int)]


class RunArgs(ctypes.Structure):
    _fields_ = [("layout", ctypes.c_int), ("phase", ctypes.c_int), ("causal_alignment", ctypes.c_int),
                ("q", ctypes.POINTER(TensorDesc)), ("k", ctypes.POINTER(TensorDesc)),
                ("v", ctypes.POINTER(TensorDesc)), ("o", ctypes.POINTER(TensorDesc)),
                ("lse", ctypes.POINTER(TensorDesc)), ("block_mask", ctypes.POINTER(TensorDesc)),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t), ("stream", ctypes.c_void_p)]


class VarlenArgs(ctypes.Structure):
    """sage_varlen_args: a packed (variable-length) call."""
    _fields_ = [("causal_alignment", ctypes.c_int), ("q", ctypes.POINTER(TensorDesc)),
                ("k", ctypes.POINTER(TensorDesc)), ("v", ctypes.POINTER(TensorDesc)),
                ("o", ctypes.POINTER(TensorDesc)), ("lse", ctypes.POINTER(TensorDesc)),
                ("cu_seqlens_q", ctypes.POINTER(TensorDesc)), ("cu_seqlens_kv", ctypes.POINTER(TensorDesc)),
                ("max_seqlen_q", ctypes.c_longlong), ("max_seqlen_kv", ctypes.c_longlong),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_size_t), ("stream", ctypes.c_void_p)]


def candidate_paths():
    """Where the library is looked for, in order: $SAGEGEN_LIBRARY (an override, never needed), next to this
    package (pip install puts it there), the lib/ of the prefix this package was installed into (cmake --install),
    and a build*/ folder of the source tree this package sits in (a checkout)."""
    explicit = os.environ.get("SAGEGEN_LIBRARY")
    if explicit:
        yield explicit
    yield os.path.join(_HERE, _NAME)
    # cmake --install: <prefix>/lib/python3/site-packages/sagegen/ -> <prefix>/lib/
    for up in (2, 3, 4):
        yield os.path.join(os.path.abspath(os.path.join(_HERE, *[".."] * up)), _NAME)
    root = os.path.dirname(os.path.dirname(_HERE))
    yield from sorted(glob.glob(os.path.join(root, "build*", "runtime", _NAME)))


def find_library():
    tried = []
    for path in candidate_paths():
        tried.append(path)
        if os.path.isfile(path):
            return path
    raise SageError(f"{_NAME} not found (looked in {', '.join(tried)}): install the package with "
                    "`pip install ./python` from the repository, or build the project")


def _declare(library):
    library.sage_abi_version.restype = ctypes.c_int
    library.sage_last_error.restype = ctypes.c_char_p
    library.sage_version.restype = ctypes.c_char_p
    library.sage_attention_create.argtypes = [ctypes.POINTER(AttentionConfig), ctypes.POINTER(ctypes.c_void_p)]
    library.sage_attention_destroy.argtypes = [ctypes.c_void_p]
    library.sage_attention_workspace_bytes.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(TensorDesc),
                                                       ctypes.POINTER(TensorDesc), ctypes.POINTER(ctypes.c_size_t)]
    library.sage_attention_block_sizes.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int),
                                                   ctypes.POINTER(ctypes.c_int)]
    library.sage_attention_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(RunArgs)]
    library.sage_attention_head_dim.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_int,
                                                ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    library.sage_attention_describe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    if hasattr(library, "sage_attention_run_varlen"):  # added within ABI version 3: looked up by symbol
        library.sage_attention_varlen_workspace_bytes.argtypes = [ctypes.c_void_p] + [ctypes.c_longlong] * 5 + [
            ctypes.POINTER(ctypes.c_size_t)]
        library.sage_attention_run_varlen.argtypes = [ctypes.c_void_p, ctypes.POINTER(VarlenArgs)]
        library.sage_attention_varlen_workspace_bytes.restype = ctypes.c_int
        library.sage_attention_run_varlen.restype = ctypes.c_int
    for name in ("sage_attention_create", "sage_attention_workspace_bytes", "sage_attention_block_sizes",
                 "sage_attention_head_dim",
                 "sage_attention_run", "sage_attention_describe"):
        getattr(library, name).restype = ctypes.c_int


_library = None


def library():
    global _library
    if _library is None:
        path = find_library()
        loaded = ctypes.CDLL(path)
        if not hasattr(loaded, "sage_abi_version") or loaded.sage_abi_version() != ABI_VERSION:
            raise SageError(f"{path}: expected the sagegen C ABI version {ABI_VERSION}; rebuild or reinstall it")
        _declare(loaded)
        _library = loaded
    return _library


def check(status):
    if status != 0:
        message = library().sage_last_error().decode()
        error = _STATUS_ERRORS.get(status, SageError)
        raise error(message if status in _STATUS_ERRORS else f"{_STATUS_NAMES.get(status, status)}: {message}")
