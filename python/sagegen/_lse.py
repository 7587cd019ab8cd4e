"""Merging partial attention results by their log-sum-exp (issue 30).

Attention over a key set split into parts K_1 .. K_P is, per query row,

    O   = sum_i exp(LSE_i - LSE) * O_i,        LSE = log sum_i exp(LSE_i)

where (O_i, LSE_i) is attention over K_i alone and LSE_i the natural-log log-sum-exp of that part's scaled logits
(what `sagegen.sageattn(..., return_lse=True)` returns). The merge here is exact in that sense (f32 arithmetic), and
numerically stable: every exponent is shifted by the row's largest LSE_i, so no term overflows.

Fully masked rows: a part in which a row sees no key has LSE_i = -inf and contributes nothing (its O_i is ignored,
even if it is not finite). A row masked in every part gets LSE = -inf and O = 0.

On CUDA tensors in eager mode, where libsagegen_c.so loads, merge_attention (of two parts), merge_attention_into and
merge_pair run the library's fused merge kernel (sage_merge_c.h: one pass over the pair of parts, O read in its own
dtype, the result written in the output's; a launch on the current stream, which CUDA graphs capture once a first
call outside the capture has loaded the kernel); elsewhere (CPU tensors, no library, f64, a gradient wanted,
torch.compile tracing, dispatch modes, tensor subclasses) they are plain torch (no data-dependent control flow, no
host synchronization), so torch.compile traces them, CUDA graphs capture them and autograd differentiates them.
O tensors are [b, h, n, d] ("HND") or [b, n, h, d] ("NHD"); LSE tensors are always [b, h, n] f32, as the kernels
write them.
"""

import ctypes

from ._library import LAYOUT_HND, LAYOUT_NHD, SageArgumentError, SageError, TensorDesc, check, library
from ._tensors import describe
from ._torch import dispatcher_free

try:
    import torch
except ImportError:  # sagegen imports without torch; these functions need it
    torch = None


def _lse_to_output(weight, layout):
    """A [.., b, h, n] row quantity broadcast against O in `layout`: [.., b, h, n, 1] or [.., b, n, h, 1]."""
    if layout == "NHD":
        weight = weight.transpose(-1, -2)
    return weight.unsqueeze(-1)


def _check_layout(layout):
    if layout not in ("HND", "NHD"):
        raise SageArgumentError(f"layout: expected 'HND' or 'NHD', got {layout!r}")


def _check_pair(output, lse, layout, name):
    if output.dim() != 4:
        raise SageArgumentError(f"{name}: expected a 4-D output tensor ({layout}), got shape {tuple(output.shape)}")
    b, x, y, _ = output.shape
    expected = (b, x, y) if layout == "HND" else (b, y, x)
    if tuple(lse.shape) != expected:
        raise SageArgumentError(f"{name}: its LSE has shape {tuple(lse.shape)}, expected [b, h, n] = {expected} for an "
                                f"output of shape {tuple(output.shape)} ({layout})")


# ---- the library's fused kernel (sage_merge_c.h) -------------------------------------------------------------------

class MergeArgs(ctypes.Structure):
    _fields_ = [("layout", ctypes.c_int)] + [(name, ctypes.POINTER(TensorDesc)) for name in
                                             ("o_a", "lse_a", "o_b", "lse_b", "o_out", "lse_out")] + [
        ("stream", ctypes.c_void_p)]


_FUSED_DTYPES = ("float16", "bfloat16", "float32")
_FUSED_MAX_HEAD_DIM = 1024  # codegen::kMergeMaxHeadDim
_merge_function = []  # [the library's sage_merge_attention, or None where it does not load]


def _merge_entry():
    """sage_merge_attention, declared; None where the library or the symbol is missing (then torch merges)."""
    if not _merge_function:
        try:
            function = library().sage_merge_attention
            function.argtypes = [ctypes.POINTER(MergeArgs)]
            function.restype = ctypes.c_int
        except (SageError, OSError, AttributeError):
            function = None
        _merge_function.append(function)
    return _merge_function[0]


def _fusable(*tensors, out_dtype=None):
    """Whether the fused kernel takes these tensors (and an output of `out_dtype`, when given): eager mode (not
    tracing, no dispatch mode), no gradient wanted, plain CUDA tensors of one device in f16 / bf16 / f32 (LSEs are
    made f32 before the call), O tensors with a head dim of stride 1 that is a multiple of 8 up to 1024, and the
    library loads."""
    if not dispatcher_free(*tensors):  # False while torch.compile traces, before anything else is looked at
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False  # the kernel has no backward: autograd differentiates the torch path
    for t in tensors:
        if t.dim() == 4 and (t.stride(-1) != 1 or t.shape[-1] % 8 != 0 or t.shape[-1] > _FUSED_MAX_HEAD_DIM):
            return False
    device = tensors[0].device
    dtypes = [t.dtype for t in tensors] + ([out_dtype] if out_dtype is not None else [])
    if any(t.device != device for t in tensors) or any(str(d).replace("torch.", "") not in _FUSED_DTYPES
                                                       for d in dtypes):
        return False
    return _merge_entry() is not None


def call_merge(o_a, lse_a, o_b, lse_b, o_out, lse_out, layout, stream):
    """sage_merge_attention on these tensors (duck-typed, as sagegen._tensors describes them) and a raw stream
    handle: the library checks everything (shapes, dtypes, devices, strides, overlaps) and launches the merge."""
    entry = _merge_entry()
    if entry is None:
        raise SageError("sage_merge_attention: the library is missing or predates the fused merge")
    descs = [describe(t, name) for t, name in ((o_a, "o_a"), (lse_a, "lse_a"), (o_b, "o_b"), (lse_b, "lse_b"),
                                                (o_out, "o_out"), (lse_out, "lse_out"))]
    args = MergeArgs(LAYOUT_HND if layout == "HND" else LAYOUT_NHD, *(ctypes.pointer(d) for d in descs), stream)
    check(entry(ctypes.byref(args)))


def _fused_merge(o_a, lse_a, o_b, lse_b, o_out, lse_out, layout):
    """One launch of the library's merge on the current stream of the tensors' device: (o_out, lse_out) <- the
    merge of (o_a, lse_a) and (o_b, lse_b)."""
    call_merge(o_a, lse_a, o_b, lse_b, o_out, lse_out, layout, torch.cuda.current_stream(o_out.device).cuda_stream)


def merge_pair(o_a, lse_a, o_b, lse_b, o_out, lse_out, layout="HND"):
    """(o_out, lse_out) <- the merge of two parts, written into the given tensors: the step of ring attention.
    o_out may be o_a and lse_out lse_a (in place: the running accumulator); otherwise they must not overlap the
    inputs. o_a, o_b, o_out in any float dtype each (f32 arithmetic); the LSEs f32 where fused. A masked part
    (LSE -inf) is ignored whatever its O holds. Fused on CUDA tensors in eager mode, torch elsewhere."""
    if torch is None:
        raise ImportError("sagegen.merge_pair needs PyTorch")
    _check_layout(layout)
    _check_pair(o_out, lse_out, layout, "o_out")
    _check_pair(o_a, lse_a, layout, "o_a")
    _check_pair(o_b, lse_b, layout, "o_b")
    for name, tensor in (("o_a", o_a), ("o_b", o_b)):
        if tensor.shape != o_out.shape:
            raise SageArgumentError(f"{name}: shape {tuple(tensor.shape)} differs from o_out's {tuple(o_out.shape)}")
    if lse_out.dtype != torch.float32:
        raise SageArgumentError(f"lse_out: expected float32, got {lse_out.dtype}")
    lse_a, lse_b = lse_a.float(), lse_b.float()  # no copy where they are f32 already (lse_out may be lse_a)
    if _fusable(o_a, o_b, o_out, lse_a, lse_b, lse_out):
        _fused_merge(o_a, lse_a, o_b, lse_b, o_out, lse_out, layout)
        return o_out, lse_out
    merged, merged_lse = merge_attention([o_a, o_b], [lse_a, lse_b], layout, dtype=o_out.dtype)
    o_out.copy_(merged)
    lse_out.copy_(merged_lse)
    return o_out, lse_out


def merge_attention(outputs, lses, layout="HND", dtype=None):
    """The exact attention output of P parts from their partial outputs and LSEs.

    outputs: a sequence of P tensors [b, h, n, d] (HND) or [b, n, h, d] (NHD); lses: a sequence of P tensors
    [b, h, n] (natural-log LSE of each part, any float dtype, -inf where the part masks the whole row). Returns
    (o, lse): o in `dtype` (default: the first output's dtype), lse f32 [b, h, n]. Computed in f32 (O in f64 when
    an output is f64).
    """
    if torch is None:
        raise ImportError("sagegen.merge_attention needs PyTorch")
    _check_layout(layout)
    outputs, lses = list(outputs), list(lses)
    if not outputs or len(outputs) != len(lses):
        raise SageArgumentError(f"lses: expected one LSE per output ({len(outputs)} outputs), got {len(lses)}")
    for index, (output, lse) in enumerate(zip(outputs, lses)):
        _check_pair(output, lse, layout, f"outputs[{index}]")
    dtype = dtype or outputs[0].dtype
    # Two parts: one fused pass. More parts stay one torch pass over all of them: merged pairwise, the running LSE is
    # rounded to f32 between merges (at |LSE| ~ 5000 that moved O by ~2.5e-4 relative on an H200, run 53).
    if len(outputs) == 2 and outputs[0].shape == outputs[1].shape:
        lses = [lse.float() for lse in lses]
        if _fusable(*outputs, *lses, out_dtype=dtype):
            return _fused_merge_two(outputs, lses, layout, dtype)
    lse = torch.stack([part.float() for part in lses])                       # [P, b, h, n]
    top = lse.amax(dim=0)
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)      # all parts masked: shift by 0
    weight = torch.exp(lse - top)                                            # 0 exactly where LSE_i = -inf
    total = weight.sum(dim=0)
    merged_lse = top + torch.log(total)                                      # log(0) = -inf for masked rows
    weight = weight / torch.where(total > 0, total, torch.ones_like(total))
    merged = None
    compute = torch.float64 if any(output.dtype == torch.float64 for output in outputs) else torch.float32
    for index, output in enumerate(outputs):
        part_weight = _lse_to_output(weight[index], layout).to(compute)
        term = torch.where(part_weight > 0, part_weight * output.to(compute),
                           torch.zeros((), dtype=compute, device=output.device))
        merged = term if merged is None else merged + term
    return merged.to(dtype), merged_lse


def _fused_merge_two(outputs, lses, layout, dtype):
    """merge_attention of two parts by the fused kernel, straight into an output in `dtype`."""
    first = outputs[0]
    out = torch.empty(first.shape, dtype=dtype, device=first.device)
    lse = torch.empty(lses[0].shape, dtype=torch.float32, device=first.device)
    _fused_merge(outputs[0], lses[0], outputs[1], lses[1], out, lse, layout)
    return out, lse


def merge_attention_into(acc_output, acc_lse, output, lse, layout="HND"):
    """In place: (acc_output, acc_lse) <- the merge of themselves with (output, lse). The running form of
    merge_attention, as ring attention uses it: acc_output is an f32 tensor (O's layout), acc_lse an f32 [b, h, n]
    tensor; both may be views (e.g. the second half of the rows). Start from acc_lse = -inf, acc_output = 0, or from
    the first part's (O, LSE) in f32. output may be any float dtype. Where its LSE is -inf the fused kernel ignores
    its O; the torch path multiplies it by a weight of 0 (so it must be finite there: the kernels write 0)
    rather than masking it out as merge_attention does. Returns (acc_output, acc_lse)."""
    if torch is None:
        raise ImportError("sagegen.merge_attention_into needs PyTorch")
    _check_layout(layout)
    _check_pair(acc_output, acc_lse, layout, "acc_output")
    _check_pair(output, lse, layout, "output")
    if acc_output.dtype != torch.float32 or acc_lse.dtype != torch.float32:
        raise SageArgumentError(f"acc_output: the accumulators must be float32, got {acc_output.dtype} and "
                                f"{acc_lse.dtype}")
    if acc_output.shape != output.shape:
        raise SageArgumentError(f"output: shape {tuple(output.shape)} differs from acc_output's "
                                f"{tuple(acc_output.shape)}")
    lse = lse.float()
    if _fusable(acc_output, output, acc_lse, lse):
        _fused_merge(acc_output, acc_lse, output, lse, acc_output, acc_lse, layout)
        return acc_output, acc_lse
    top = torch.maximum(acc_lse, lse)
    top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    old_weight, new_weight = torch.exp(acc_lse - top), torch.exp(lse - top)
    total = old_weight + new_weight
    inverse = torch.where(total > 0, 1.0 / torch.where(total > 0, total, torch.ones_like(total)),
                          torch.zeros_like(total))
    new_lse = top + torch.log(total)
    old_scale, new_scale = _lse_to_output(old_weight * inverse, layout), _lse_to_output(new_weight * inverse, layout)
    # Two passes over the f32 accumulator: scale it, then add the new part times its weight (0 for a masked row).
    acc_output.mul_(old_scale)
    acc_output.addcmul_(output.to(acc_output.dtype), new_scale)
    acc_lse.copy_(new_lse)
    return acc_output, acc_lse
