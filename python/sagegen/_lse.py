"""Merging partial attention results by their log-sum-exp (issue 30).

Attention over a key set split into parts K_1 .. K_P is, per query row,

    O   = sum_i exp(LSE_i - LSE) * O_i,        LSE = log sum_i exp(LSE_i)

where (O_i, LSE_i) is attention over K_i alone and LSE_i the natural-log log-sum-exp of that part's scaled logits
(what `sagegen.sageattn(..., return_lse=True)` returns). The merge here is exact in that sense (f32 arithmetic), and
numerically stable: every exponent is shifted by the row's largest LSE_i, so no term overflows.

Fully masked rows: a part in which a row sees no key has LSE_i = -inf and contributes nothing (its O_i is ignored,
even if it is not finite). A row masked in every part gets LSE = -inf and O = 0.

Both functions are plain torch (no data-dependent control flow, no host synchronization), so torch.compile traces
them and CUDA graphs capture them. O tensors are [b, h, n, d] ("HND") or [b, n, h, d] ("NHD"); LSE tensors are
always [b, h, n] f32, as the kernels write them.
"""

from ._library import SageArgumentError

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
    return merged.to(dtype or outputs[0].dtype), merged_lse


def merge_attention_into(acc_output, acc_lse, output, lse, layout="HND"):
    """In place: (acc_output, acc_lse) <- the merge of themselves with (output, lse). The running form of
    merge_attention, as ring attention uses it: acc_output is an f32 tensor (O's layout), acc_lse an f32 [b, h, n]
    tensor; both may be views (e.g. the second half of the rows). Start from acc_lse = -inf, acc_output = 0, or from
    the first part's (O, LSE) in f32. output may be any float dtype; where its LSE is -inf its O must be finite (the
    kernels write 0 there): it is multiplied by a weight of 0, in one fused pass, rather than masked out as
    merge_attention does. Returns (acc_output, acc_lse)."""
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
