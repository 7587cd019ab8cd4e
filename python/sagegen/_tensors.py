"""Tensors to the C ABI's descriptions. Duck-typed (shape, stride(), dtype, device, data_ptr()), so PyTorch is not
needed to import sagegen or to test these checks. Everything about sizes, dtypes and devices is checked again, and
completely, by the library (runtime/src/AttentionCall.cpp); Python only refuses what it cannot describe."""

from ._library import (DTYPE_BF16, DTYPE_BOOL, DTYPE_F16, DTYPE_F32, DTYPE_I32, DTYPE_U8, HOST_MEMORY, LAYOUT_HND,
                       LAYOUT_NHD, SageArgumentError, TensorDesc)

_DTYPES = {"float16": DTYPE_F16, "half": DTYPE_F16, "bfloat16": DTYPE_BF16, "float32": DTYPE_F32,
           "float": DTYPE_F32, "uint8": DTYPE_U8, "bool": DTYPE_BOOL,
           "int32": DTYPE_I32}
DTYPE_NAMES = {DTYPE_F16: "f16", DTYPE_BF16: "bf16"}

LAYOUTS = {"HND": LAYOUT_HND, "NHD": LAYOUT_NHD}


def dtype_code(dtype, name):
    """The sage_dtype of a torch dtype (by name: torch.float16 -> 'float16')."""
    text = str(dtype).replace("torch.", "")
    if text not in _DTYPES:
        raise SageArgumentError(f"{name}: dtype {text} is not supported (expected float16 or bfloat16; float32 for "
                                "lse, uint8 or bool for block_mask, int32 for cu_seqlens)")
    return _DTYPES[text]


def device_index(tensor, name):
    """The CUDA ordinal of the tensor's device, HOST_MEMORY for the CPU; other device types are refused."""
    device = tensor.device
    kind = getattr(device, "type", str(device))
    if kind == "cpu":
        return HOST_MEMORY
    if kind != "cuda":
        raise SageArgumentError(f"{name}: is on a {kind} device, expected a CUDA tensor")
    index = getattr(device, "index", None)
    return 0 if index is None else index


def layout_code(layout):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise SageArgumentError(f"tensor_layout: expected 'HND' or 'NHD', got {layout!r}")
    return LAYOUTS[layout]


# dtype / device object -> its code: str(dtype) and the device's fields once per object seen, not on every call
_CODES, _DEVICES = {}, {}


def _cached(cache, key, compute):
    try:
        value = cache.get(key)
    except TypeError:  # an unhashable stand-in for a dtype or device: no caching
        return compute()
    if value is None:
        value = cache[key] = compute()  # only what was accepted: a refused one raises each time
    return value


def describe(tensor, name):
    """A TensorDesc of `tensor`: 1 to 4 dimensions, its strides in elements."""
    if tensor is None:
        raise SageArgumentError(f"{name}: expected a tensor, got None")
    try:
        shape, strides, dtype, data = tensor.shape, tensor.stride(), tensor.dtype, tensor.data_ptr()
        device = tensor.device
    except (AttributeError, TypeError):
        raise SageArgumentError(f"{name}: expected a tensor (shape, stride(), dtype, device, data_ptr()), "
                                f"got {type(tensor).__name__}") from None
    ndim = len(shape)
    if not 1 <= ndim <= 4:
        raise SageArgumentError(f"{name}: expected 1 to 4 dimensions, got shape {tuple(int(size) for size in shape)}")
    desc = TensorDesc()
    desc.data = data or None
    desc.ndim = ndim
    desc.shape[:ndim] = [int(size) for size in shape]
    desc.strides[:ndim] = [int(stride) for stride in strides]
    desc.dtype = _cached(_CODES, dtype, lambda: dtype_code(dtype, name))
    desc.device = _cached(_DEVICES, device, lambda: device_index(tensor, name))
    return desc


def heads_tokens(tensor, layout, name):
    """(batch, heads, tokens, head_dim) of a 4-D tensor in `layout`."""
    if len(tensor.shape) != 4:
        raise SageArgumentError(f"{name}: expected a 4-D tensor ({'[b, h, n, d]' if layout == 'HND' else '[b, n, h, d]'}"
                                f" for layout {layout}), got shape {tuple(tensor.shape)}")
    b, x, y, d = (int(size) for size in tensor.shape)
    return (b, x, y, d) if layout == "HND" else (b, y, x, d)
