"""The fused LSE merge (issue 30) from PyTorch on a GPU: sagegen.merge_attention, merge_attention_into and
sagegen._lse.merge_pair on CUDA tensors run the library's kernel (sage_merge_c.h); each is compared with a
double-precision merge on the host and with the torch path on the same GPU (the library switched off), within f32
rounding: masked rows (LSE -inf in one part, with NaN in its O; in both parts), both layouts, row slices of the
accumulator (the causal ring's halves, other rows untouched), f16 / bf16 / f32 parts, outputs in another dtype, and
a partial overlap refused naming the argument.

    python3 python/tests/test_merge_gpu.py [-k NAME]
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import raises, run_tests  # noqa: E402
import sagegen  # noqa: E402
from sagegen import _lse  # noqa: E402

MINUS_INF = float("-inf")


def parts(layout, dtype, b=2, h=4, n=300, d=128, seed=0):
    """Two parts' (O, LSE) on the GPU: O in `dtype`, LSE f32 with masked rows (part A's O NaN there) and rows whose
    LSEs would overflow unshifted."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    o = [torch.randn(shape, device="cuda", generator=generator).to(dtype) for _ in range(2)]
    lse = [torch.rand((b, h, n), device="cuda", generator=generator) * 8 - 4 for _ in range(2)]
    rows = torch.arange(n, device="cuda")
    lse[0][:, :, rows % 13 == 1], lse[1][:, :, rows % 13 == 1] = 5000.0, 5001.0  # the masks below win
    lse[0][:, :, rows % 7 == 3] = MINUS_INF          # masked in A only
    lse[1][:, :, rows % 7 == 5] = MINUS_INF          # masked in B only
    lse[0][:, :, rows % 11 == 0] = MINUS_INF         # masked in both
    lse[1][:, :, rows % 11 == 0] = MINUS_INF
    masked_a = (rows % 7 == 3) | (rows % 11 == 0)
    if layout == "HND":
        o[0][:, :, masked_a] = float("nan")
    else:
        o[0][:, masked_a] = float("nan")
    return o, lse


def host_merge(outputs, lses, layout):
    """The reference in f64 on the host: weights e^(LSE_i - LSE), a masked part (weight 0) left out whatever its O
    holds; a row masked everywhere gets LSE -inf and O 0."""
    lse = torch.stack([part.cpu().double() for part in lses])
    top = lse.amax(dim=0)
    top = torch.where(top == MINUS_INF, torch.zeros_like(top), top)
    weight = torch.exp(lse - top)
    total = weight.sum(dim=0)
    weight = weight / torch.where(total > 0, total, torch.ones_like(total))
    merged = 0
    for index, output in enumerate(outputs):
        part_weight = _lse._lse_to_output(weight[index], layout)
        merged = merged + torch.where(part_weight > 0, part_weight * output.cpu().double(),
                                      torch.zeros((), dtype=torch.float64))
    return merged, top + torch.log(total)


def torch_path(function, *args, **kwargs):
    """`function` with the library's merge switched off: the torch path on the same GPU."""
    saved = list(_lse._merge_function)
    _lse._merge_function[:] = [None]
    try:
        return function(*args, **kwargs)
    finally:
        _lse._merge_function[:] = saved


def assert_merge_close(o, lse, expected_o, expected_lse, rounding, what):
    """O within the output dtype's rounding plus f32 arithmetic; LSE within f32 rounding, -inf exactly."""
    o, lse = o.cpu().double(), lse.cpu().double()
    assert torch.isfinite(o).all(), f"{what}: non-finite O"
    assert torch.equal(torch.isinf(lse), torch.isinf(expected_lse)), f"{what}: -inf rows differ"
    finite = torch.isfinite(expected_lse)
    lse_error = ((lse - expected_lse)[finite].abs() / (1 + expected_lse[finite].abs())).max().item()
    assert lse_error <= 3e-7, f"{what}: LSE error {lse_error:.3g}"
    o_error = ((o - expected_o).abs() - rounding * expected_o.abs()).max().item()
    assert o_error <= 1e-5, f"{what}: O error {o_error:.3g} beyond the dtype's rounding"
    return o_error


ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def test_the_fused_path_is_taken():
    o, lse = parts("HND", torch.bfloat16)
    acc = o[0].float()
    assert _lse._merge_entry() is not None, "libsagegen_c.so exports sage_merge_attention"
    assert _lse._fusable(acc, o[1], lse[0], lse[1])
    assert not _lse._fusable(acc.cpu(), o[1].cpu(), lse[0].cpu(), lse[1].cpu())
    assert not _lse._fusable(acc.double(), o[1], lse[0], lse[1])
    assert not _lse._fusable(acc[..., ::2], o[1][..., ::2], lse[0], lse[1])  # head-dim stride 2: torch
    # Gradients wanted: the torch path, which autograd differentiates.
    wanting = o[1].float().requires_grad_()
    assert not _lse._fusable(acc, wanting, lse[0], lse[1])
    merged, _ = sagegen.merge_attention([torch.nan_to_num(acc), wanting], [lse[0], lse[1]])
    merged.sum().backward()
    assert wanting.grad is not None and torch.isfinite(wanting.grad).all()
    with torch.no_grad():
        assert _lse._fusable(acc, wanting, lse[0], lse[1])


def test_merge_attention_into_matches_the_host_and_the_torch_path():
    for layout in ("HND", "NHD"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            o, lse = parts(layout, dtype)
            expected_o, expected_lse = host_merge(o, lse, layout)
            # a copy: .float() of an f32 part is the part itself, which the merge below writes
            acc, acc_lse = o[0].to(torch.float32, copy=True), lse[0].clone()
            sagegen.merge_attention_into(acc, acc_lse, o[1], lse[1], layout)
            assert_merge_close(acc, acc_lse, expected_o, expected_lse, 0.0, f"into, {layout}, {dtype}")
            # The torch path multiplies a masked part by 0: it needs finite O there.
            acc_torch, acc_lse_torch = torch.nan_to_num(o[0].float()), lse[0].clone()
            torch_path(sagegen.merge_attention_into, acc_torch, acc_lse_torch, o[1], lse[1], layout)
            assert torch.allclose(acc, acc_torch, atol=1e-5, rtol=1e-5), f"fused vs torch, {layout}, {dtype}"
            assert torch.allclose(acc_lse, acc_lse_torch, atol=1e-5, rtol=1e-6), f"fused vs torch LSE, {layout}"


def test_row_slices_of_the_accumulator_leave_other_rows_alone():
    for layout in ("HND", "NHD"):
        o, lse = parts(layout, torch.bfloat16, n=256)
        seq = 2 if layout == "HND" else 1
        half = slice(128, 256)
        at = lambda t: t[(slice(None),) * seq + (half,)]  # noqa: E731
        acc, acc_lse = torch.nan_to_num(o[0].float()), lse[0].clone()
        before, before_lse = acc.clone(), acc_lse.clone()
        part_o, part_lse = at(o[1]).contiguous(), lse[1][..., half].contiguous()
        sagegen.merge_attention_into(at(acc), acc_lse[..., half], part_o, part_lse, layout)
        expected_o, expected_lse = host_merge([at(before), part_o], [before_lse[..., half], part_lse], layout)
        assert_merge_close(at(acc), acc_lse[..., half], expected_o, expected_lse, 0.0, f"slice, {layout}")
        other = (slice(None),) * seq + (slice(0, 128),)
        assert torch.equal(acc[other], before[other]) and torch.equal(acc_lse[..., :128], before_lse[..., :128])


def test_merge_attention_of_two_and_three_parts():
    for layout in ("HND", "NHD"):
        o, lse = parts(layout, torch.bfloat16, seed=3)
        o3, lse3 = parts(layout, torch.bfloat16, seed=4)
        o.append(torch.nan_to_num(o3[1]))
        lse.append(lse3[1])
        for count in (2, 3):
            for dtype in (None, torch.float32, torch.float16):
                merged, merged_lse = sagegen.merge_attention(o[:count], lse[:count], layout, dtype=dtype)
                assert merged.dtype == (dtype or torch.bfloat16)
                expected_o, expected_lse = host_merge(o[:count], lse[:count], layout)
                assert_merge_close(merged, merged_lse, expected_o, expected_lse, ROUNDING[merged.dtype],
                                   f"{count} parts, {layout}, into {merged.dtype}")
                clean = [torch.nan_to_num(t) for t in o[:count]]  # what the torch path sees must not matter
                merged_torch, lse_torch = torch_path(sagegen.merge_attention, clean, lse[:count], layout, dtype=dtype)
                assert torch.allclose(merged.float(), merged_torch.float(), atol=1e-5,
                                      rtol=2 * ROUNDING[merged.dtype] + 1e-5)
                assert torch.allclose(merged_lse, lse_torch, atol=1e-5, rtol=1e-6)


def test_merge_pair_into_a_new_output_of_the_query_dtype():
    for layout in ("HND", "NHD"):
        for out_dtype in (torch.bfloat16, torch.float16):
            o, lse = parts(layout, out_dtype, seed=7)
            acc, acc_lse = o[0].float(), lse[0].clone()
            out = torch.empty_like(o[1])
            _lse.merge_pair(acc, acc_lse, o[1], lse[1], out, acc_lse, layout)  # the ring's last step
            expected_o, expected_lse = host_merge(o, lse, layout)
            assert_merge_close(out, acc_lse, expected_o, expected_lse, ROUNDING[out_dtype], f"pair, {layout}")


def test_a_partial_overlap_is_refused_naming_the_argument():
    o, lse = parts("HND", torch.float32)
    acc = o[0].clone()
    with raises(sagegen.SageArgumentError, match="^o_out: overlaps o_a"):
        _lse.merge_pair(acc[:, :, 1:], lse[0][:, :, 1:], o[1][:, :, 1:], lse[1][:, :, 1:], acc[:, :, :-1],
                        torch.empty_like(lse[0][:, :, 1:]), "HND")


def main(argv):
    if not torch.cuda.is_available():
        print("test_merge_gpu.py: SKIPPED, no CUDA device")
        return 0
    return run_tests(globals(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
