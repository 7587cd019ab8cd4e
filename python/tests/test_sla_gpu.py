"""SLA (issue 13) from PyTorch on a GPU: sagegen.SparseLinearAttention (the kernels' forward and backward through
the C ABI, Proj a torch.nn.Linear the caller owns) against PyTorch autograd of a dense float64 implementation of the
same formula with the same block classes, in f16 and bf16 (bf16 also against that dense formula's autograd in bf16).
Prints one line per case.

    python3 python/tests/test_sla_gpu.py       (tools/gpu-check --run does this)
"""

import math
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sagegen  # noqa: E402

PHI = {"softmax": lambda x: torch.softmax(x, dim=-1), "elu_plus_one": lambda x: F.elu(x) + 1.0, "relu": F.relu}


def dense_sla(q, k, v, weight, bias, classes, phi, block_q=64, block_kv=64):
    """O = softmax over the critical keys (S / sqrt(d)) V + Proj(phi(Q) phi(K)^T over the marginal keys, normalized)."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    n, m, d = q.shape[2], k.shape[2], q.shape[3]
    cls = classes.long().repeat_interleave(block_q, dim=2)[:, :, :n].repeat_interleave(block_kv, dim=3)[..., :m]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(cls != 1, float("-inf"))
    o_sparse = torch.softmax(scores, dim=-1) @ v
    weights = (PHI[phi](q) @ PHI[phi](k).transpose(-1, -2)) * (cls == 0)
    denominator = weights.sum(-1, keepdim=True)
    tiny = torch.finfo(q.dtype).tiny  # no 0 / 0 in the branch where() drops (its gradient would be NaN)
    o_linear = torch.where(denominator != 0, (weights @ v) / denominator.clamp_min(tiny), torch.zeros_like(q))
    return o_sparse + o_linear @ weight.T + bias


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def relative_l1(reference, candidate):
    return float((reference.double() - candidate.double()).abs().sum() / reference.double().abs().sum())


def standard_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim):
    return (torch.randn(1, heads_q, tokens_q, dim, device="cuda"), torch.randn(1, heads_kv, tokens_kv, dim, device="cuda"),
            torch.randn(1, heads_kv, tokens_kv, dim, device="cuda"))


def channel_offset_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim):
    """K with a large offset per channel, shared by every token (what trained models' keys look like)."""
    q, k, v = standard_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim)
    return q, k + 4.0 * torch.randn(1, heads_kv, 1, dim, device="cuda"), v


def sharp_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim):
    """Sharp logits: Q and K scaled so that S / sqrt(d) has a standard deviation of ~9."""
    q, k, v = standard_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim)
    return 3.0 * q, 3.0 * k, v


def large_value_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim):
    """V with a standard deviation of 8e3 (its largest values ~4e4, near f16's 65504). bf16 V beyond 65504 overflows
    the sparse part's f16 P.V (its V is converted to f16): a known limit."""
    q, k, v = standard_inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim)
    return q, k, 8e3 * v


def check_case(preset, phi, heads_q, heads_kv, tokens_q, tokens_kv, dim, critical=5.0, negligible=10.0,
               dtype=torch.float16, inputs=standard_inputs):
    """The module against float64 autograd of the dense formula: cosine above 0.999 (0.99 for sla-int8's forward and
    dW, db), for f16 and bf16 alike. bf16 also against the dense formula's autograd in bf16 (bf16 Q, K, V, Proj):
    sla-f16's relative L1 error at most twice the dense bf16 formula's."""
    torch.manual_seed(0)
    q, k, v = (t.to(dtype).requires_grad_() for t in inputs(heads_q, heads_kv, tokens_q, tokens_kv, dim))
    proj = torch.nn.Linear(dim, dim).cuda()
    sla = sagegen.SparseLinearAttention(dim, proj, preset=preset, critical_percent=critical,
                                        negligible_percent=negligible, feature_map=phi)
    out = sla(q, k, v)
    grad = torch.randn_like(out)
    out.backward(grad)
    classes = sla.last_classes.clone()
    counts = [(classes == c).sum(-1) for c in (1, 0, -1)]
    assert all(bool((c == c.flatten()[0]).all()) for c in counts), "every row has the same class counts"

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    w64 = proj.weight.detach().double().requires_grad_()
    b64 = proj.bias.detach().double().requires_grad_()
    reference = dense_sla(q64, k64, v64, w64, b64, classes, phi)
    reference.backward(grad.double())
    results = {"O": (reference, out), "dQ": (q64.grad, q.grad), "dK": (k64.grad, k.grad), "dV": (v64.grad, v.grad),
               "dW": (w64.grad, proj.weight.grad), "db": (b64.grad, proj.bias.grad)}
    dense = None
    if dtype == torch.bfloat16:
        q16, k16, v16 = (t.detach().clone().requires_grad_() for t in (q, k, v))
        w16 = proj.weight.detach().to(dtype).requires_grad_()
        b16 = proj.bias.detach().to(dtype).requires_grad_()
        dense_out = dense_sla(q16, k16, v16, w16, b16, classes, phi)
        dense_out.backward(grad)
        dense = {"O": dense_out, "dQ": q16.grad, "dK": k16.grad, "dV": v16.grad, "dW": w16.grad, "db": b16.grad}
    for name, (expected, got) in results.items():
        assert got.dtype == (proj.weight.dtype if name in ("dW", "db") else dtype), f"{name}: dtype {got.dtype}"
    line = []
    for name, (expected, got) in results.items():
        c, r = cosine(expected, got), relative_l1(expected, got)
        line.append(f"{name} cos {c:.6f} rel-L1 {r:.1e}")
        minimum = 0.999 if preset == "sla-f16" or name in ("dQ", "dK", "dV") else 0.99
        assert c > minimum, f"{name}: cosine {c} <= {minimum}"
        if dense is not None:
            dense_r = relative_l1(expected, dense[name])
            line[-1] += f" (dense bf16 {dense_r:.1e})"
            if preset == "sla-f16":
                assert r <= 2.0 * dense_r, f"{name}: rel-L1 {r} above twice the dense bf16 formula's {dense_r}"
    print(f"test_sla_gpu: {preset} {str(dtype).replace('torch.', '')} {inputs.__name__} phi={phi} h {heads_q}/"
          f"{heads_kv} n {tokens_q}/{tokens_kv} d{dim} k_h {critical} k_l {negligible}: " + ", ".join(line))


def test_sla_matches_dense_autograd():
    check_case("sla-f16", "softmax", 2, 1, 1000, 1300, 128)
    check_case("sla-f16", "elu_plus_one", 2, 2, 512, 512, 64)
    check_case("sla-f16", "relu", 2, 1, 640, 640, 128, critical=30.0, negligible=20.0)
    check_case("sla-int8", "softmax", 2, 2, 1024, 1024, 128)


def test_sla_bf16_matches_dense_autograd():
    """bf16 q, k, v (Proj in f32, as the f16 cases): the same bounds as f16, on standard inputs, K with per-channel
    offsets and sharp logits."""
    bf16 = torch.bfloat16
    check_case("sla-f16", "softmax", 2, 1, 1000, 1300, 128, dtype=bf16)
    check_case("sla-f16", "softmax", 2, 2, 1024, 1024, 128, dtype=bf16, inputs=channel_offset_inputs)
    check_case("sla-f16", "softmax", 2, 1, 768, 768, 64, dtype=bf16, inputs=sharp_inputs)
    check_case("sla-f16", "elu_plus_one", 2, 2, 512, 512, 64, dtype=bf16)
    check_case("sla-int8", "softmax", 2, 2, 1024, 1024, 128, dtype=bf16, inputs=channel_offset_inputs)


def test_sla_bf16_large_values():
    """bf16 V of large magnitude (~4e4 at most): finite and as accurate as at unit scale."""
    check_case("sla-f16", "softmax", 2, 2, 1024, 1024, 128, dtype=torch.bfloat16, inputs=large_value_inputs)


def test_sla_bf16_proj_in_bf16():
    """A Proj whose parameters are bf16 (the module casts O^l to them): O and the gradients in bf16."""
    torch.manual_seed(3)
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in standard_inputs(2, 2, 512, 512, 128))
    proj = torch.nn.Linear(128, 128).cuda().to(torch.bfloat16)
    sla = sagegen.SparseLinearAttention(128, proj)
    out = sla(q, k, v)
    out.backward(torch.randn_like(out))
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    for name, tensor in (("dQ", q.grad), ("dK", k.grad), ("dV", v.grad), ("dW", proj.weight.grad)):
        assert tensor.dtype == torch.bfloat16 and bool(torch.isfinite(tensor).all()), name
    print("test_sla_gpu: bf16 with a bf16 Proj: O and the gradients bf16 and finite")


class SlaRun:
    """One forward of a preset's kernels on fixed shapes (2 query heads, 1 kv head, 700 x 900 tokens, d = 128), with
    random dO^s and dO^l for the backward."""

    def __init__(self, preset, seed):
        from sagegen import _sla
        torch.manual_seed(seed)
        self.q = torch.randn(1, 2, 700, 128, device="cuda", dtype=torch.float16)
        self.k = torch.randn(1, 1, 900, 128, device="cuda", dtype=torch.float16)
        self.v = torch.randn(1, 1, 900, 128, device="cuda", dtype=torch.float16)
        self.d_sparse = torch.randn(self.q.shape, dtype=torch.float32, device="cuda")
        self.d_linear = torch.randn(self.q.shape, dtype=torch.float32, device="cuda")
        self.kernels = _sla.SlaKernels(preset, 128, 5.0, 10.0, None, torch.cuda.current_device())
        self.stream = torch.cuda.current_stream().cuda_stream
        self.workspace = torch.empty(self.kernels.workspace(self.q, self.k)[0], dtype=torch.uint8, device="cuda")
        self.o_sparse = torch.empty_like(self.q)
        self.o_linear = torch.empty(self.q.shape, dtype=torch.float32, device="cuda")
        self.forward(self.q)

    def forward(self, q):
        self.kernels.forward(q, self.k, self.v, self.o_sparse, self.o_linear, self.workspace, self.stream)

    def backward(self, inputs, o_sparse):
        """dQ, dK, dV (NaN before the call, so that an element the kernels skip shows) from (q, k, v, dO^s, dO^l)."""
        grads = [torch.full(t.shape, float("nan"), dtype=torch.float32, device="cuda") for t in inputs[:3]]
        self.kernels.backward(*inputs, *grads, self.workspace, self.stream, o_sparse=o_sparse)
        return grads

    def inputs(self):
        return [self.q, self.k, self.v, self.d_sparse, self.d_linear]


def check_same_gradients(label, expected, candidate, min_cosine, max_rel_l1, digits):
    """Asserts that two backwards' dQ, dK, dV agree and are finite; prints one line."""
    torch.cuda.synchronize()
    line = []
    for name, a, b in zip(("dQ", "dK", "dV"), expected, candidate):
        c, r = cosine(a, b), relative_l1(a, b)
        line.append(f"{name} cos {c:.{digits}f} rel-L1 {r:.1e}")
        assert bool(torch.isfinite(b).all()), f"{name}: non-finite: {label}"
        assert c > min_cosine and r < max_rel_l1, f"{name}: {label} differ: cos {c}, rel-L1 {r}"
    print(f"test_sla_gpu: {label}: " + ", ".join(line))


def test_sla_backward_with_saved_lse_matches_recomputed():
    """The backward both ways on one forward: with O^s passed (an exact preset saved L in the forward: D^s from O^s)
    and without (the statistics kernel recomputes L and D^s); sla-int8 recomputes either way. O^s given as float32 is
    refused naming it."""
    for preset in ("sla-f16", "sla-int8"):
        run = SlaRun(preset, seed=1)
        saved = run.backward(run.inputs(), run.o_sparse)  # first: the statistics kernel overwrites L (with the same L)
        recomputed = run.backward(run.inputs(), None)
        check_same_gradients(f"{preset} backward with O^s passed vs recomputed statistics", recomputed, saved,
                             min_cosine=0.99999, max_rel_l1=2e-3, digits=7)
        try:
            run.backward(run.inputs(), run.o_sparse.float())
        except sagegen.SageArgumentError as error:
            assert "o_sparse" in str(error), str(error)
        else:
            raise AssertionError("a float32 o_sparse was accepted")


def unaligned_view(tensor):
    """The same values, contiguous, at an address one element past a 16-byte boundary (the API takes contiguous
    tensors only)."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = storage[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.is_contiguous() and view.data_ptr() % 16 != 0
    return view


def test_sla_backward_reads_unaligned_rows():
    """The backward on q, k, v and dO^s / dO^l at unaligned addresses against the same values at aligned ones, after
    one forward: the same gradients (the backward's kernels read unaligned rows through registers; only the order of
    dK/dV's f32 reductions may differ). The forward refuses such q and v, naming them (its prologue and TMA read 16
    bytes at a time)."""
    for preset in ("sla-f16", "sla-int8"):
        run = SlaRun(preset, seed=2)
        try:
            run.forward(unaligned_view(run.q))
        except sagegen.SageArgumentError as error:
            assert "q: data must be 16-byte aligned" in str(error), str(error)
        else:
            raise AssertionError("the forward accepted an unaligned q")
        aligned = run.backward(run.inputs(), run.o_sparse)
        unaligned = run.backward([unaligned_view(t) for t in run.inputs()], run.o_sparse)
        check_same_gradients(f"{preset} backward on unaligned inputs vs aligned", aligned, unaligned,
                             min_cosine=0.999999, max_rel_l1=1e-4, digits=8)


def test_sla_refuses_bad_input():
    sla = sagegen.SparseLinearAttention(128)
    q = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.float32)
    try:
        sla(q, q, q)
    except sagegen.SageArgumentError as error:
        assert "q:" in str(error)
    else:
        raise AssertionError("float32 q was accepted")
    # Mixed dtypes are refused naming the argument, in the module and at the C ABI (an SLA object has one dtype).
    q16 = torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16)
    try:
        sla(q16, q16.half(), q16)
    except sagegen.SageArgumentError as error:
        assert str(error).startswith("k:"), str(error)
    else:
        raise AssertionError("bf16 q with f16 k was accepted")
    from sagegen import _sla
    bf16_kernels = _sla.SlaKernels("sla-f16", 128, 5.0, 10.0, None, torch.cuda.current_device(), "bf16")
    try:
        bf16_kernels.workspace(q16, q16.half())
    except sagegen.SageArgumentError as error:
        assert "k: expected dtype bf16" in str(error), str(error)
    else:
        raise AssertionError("the C ABI accepted an f16 k for a bf16 SLA object")
    # The kernels' API takes contiguous tensors (the module makes them so): a strided q is refused with the stride.
    kernels = _sla.SlaKernels("sla-f16", 128, 5.0, 10.0, None, torch.cuda.current_device())
    strided = torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.float16).transpose(1, 2)
    k = strided.contiguous()
    workspace = torch.empty(kernels.workspace(k, k)[0], dtype=torch.uint8, device="cuda")
    outputs = (torch.empty_like(k), torch.empty(k.shape, dtype=torch.float32, device="cuda"))
    try:
        kernels.forward(strided, k, k, *outputs, workspace, torch.cuda.current_stream().cuda_stream)
    except sagegen.SageArgumentError as error:
        assert "q: must be contiguous: expected stride 128 (elements) in dimension 2, got 256" in str(error), str(error)
    else:
        raise AssertionError("a strided q was accepted")


def main():
    if not torch.cuda.is_available():
        print("test_sla_gpu.py: SKIPPED, no CUDA device")
        return 0
    failures = 0
    for name, function in sorted((n, f) for n, f in globals().items() if n.startswith("test_") and callable(f)):
        try:
            function()
            print(f"PASS {name}")
        except Exception:
            failures += 1
            print(f"FAIL {name}\n{traceback.format_exc()}")
    print(f"test_sla_gpu.py: {failures} failed" if failures else "test_sla_gpu.py: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
