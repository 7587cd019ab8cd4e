"""sagegen.sageattn_varlen on a GPU (issue 28): packed sequences against PyTorch SDPA run on each sequence alone and
against sagegen's dense sageattn on each sequence (same quantizers: nearly equal), causal bottom-right
(FlashAttention's) and top-left, GQA, bf16, a strided Q view, the LSE, lengths 0 and 1, CUDA-graph capture with fixed
maxima replayed with new offsets, repeated (bound) calls with offsets written in place, and bad offsets refused naming
the argument. Prints each case's numbers.

    python3 python/tests/test_varlen_gpu.py [-k NAME]
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import raises, run_tests  # noqa: E402
import sagegen  # noqa: E402
from sagegen._varlen import torch_varlen_attention  # noqa: E402

LENGTHS_Q = [1, 0, 77, 128, 300, 1000]
LENGTHS_K = [64, 40, 77, 0, 250, 1000]


def offsets(lengths):
    return torch.tensor([0] + lengths, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def packed(lengths_q=LENGTHS_Q, lengths_k=LENGTHS_K, heads_q=8, heads_kv=2, dim=128, dtype=torch.float16):
    q = torch.randn(sum(lengths_q), heads_q, dim, dtype=dtype, device="cuda")
    k, v = (torch.randn(sum(lengths_k), heads_kv, dim, dtype=dtype, device="cuda") for _ in range(2))
    return q, k, v, offsets(lengths_q), offsets(lengths_k)


def rel_l1(out, expected):
    out, expected = out.float(), expected.float()
    return ((out - expected).abs().sum() / expected.abs().sum().clamp_min(1e-30)).item()


def check(out, expected, max_rel_l1, min_cosine=0.995, what=""):
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    error = rel_l1(out, expected)
    cosine = F.cosine_similarity(out.float().flatten(), expected.float().flatten(), dim=0).item()
    print(f"  {what}: rel-L1 {error:.4f} cos {cosine:.6f}")
    assert error <= max_rel_l1, f"{what}: rel-L1 {error:.4f} > {max_rel_l1}"
    assert cosine >= min_cosine, f"{what}: cosine {cosine:.5f} < {min_cosine}"


def reference(q, k, v, cu_q, cu_k, is_causal, bottom_right=True, return_lse=False):
    """Per-sequence SDPA in f32."""
    return torch_varlen_attention(q.float(), k.float(), v.float(), cu_q, cu_k, is_causal, None, return_lse,
                                  bottom_right)


# Bounds against exact f32 attention on N(0, 1) data (the quantization error of each preset, as the dense GPU tests
# allow: test_gpu.py's cosine 0.995) and against sagegen's dense call on each sequence alone (same quantizers: only
# f32 summation order differs).
PRESET_BOUNDS = {"sage-b": 0.05, "sage2-fp8": 0.08}


def test_packed_matches_sdpa_per_sequence():
    for preset, bound in PRESET_BOUNDS.items():
        for dim, causal, dtype in ((128, True, torch.float16), (64, False, torch.bfloat16),
                                   (128, False, torch.float16)):
            torch.manual_seed(0)
            q, k, v, cu_q, cu_k = packed(dim=dim, dtype=dtype)
            out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1100, 1200, is_causal=causal, preset=preset)
            expected = reference(q, k, v, cu_q, cu_k, causal)
            check(out, expected, bound, what=f"{preset} d{dim} {'causal' if causal else 'full'} {dtype}")
            empty_k = slice(int(cu_q[3]), int(cu_q[4]))  # sequence 3 has no keys: O = 0
            assert (out[empty_k] == 0).all()


def test_each_sequence_equals_the_dense_call_on_it():
    torch.manual_seed(1)
    q, k, v, cu_q, cu_k = packed()
    for causal in (False, True):
        out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=causal)
        for b, (length_q, length_k) in enumerate(zip(LENGTHS_Q, LENGTHS_K)):
            if length_q == 0 or length_k == 0:
                continue
            rows_q = slice(int(cu_q[b]), int(cu_q[b + 1]))
            rows_k = slice(int(cu_k[b]), int(cu_k[b + 1]))
            dense = sagegen.sageattn(q[rows_q][None], k[rows_k][None], v[rows_k][None], tensor_layout="NHD",
                                     is_causal=causal, causal_alignment="bottom-right")[0]
            check(out[rows_q], dense, 0.01, 0.9999, what=f"sequence {b} vs dense sageattn, causal={causal}")


def test_top_left_alignment_on_request():
    torch.manual_seed(2)
    q, k, v, cu_q, cu_k = packed(lengths_q=[300, 50], lengths_k=[200, 400])
    out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 300, 400, is_causal=True, causal_alignment="top-left")
    check(out, reference(q, k, v, cu_q, cu_k, True, bottom_right=False), 0.05, what="top-left")


def test_lse_and_sm_scale():
    torch.manual_seed(3)
    q, k, v, cu_q, cu_k = packed()
    out, lse = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=True, return_lse=True)
    expected, expected_lse = reference(q, k, v, cu_q, cu_k, True, return_lse=True)
    assert lse.shape == (8, q.shape[0]) and lse.dtype == torch.float32
    check(out, expected, 0.05, what="with lse")
    finite = torch.isfinite(expected_lse)
    assert (torch.isinf(lse[~finite]) & (lse[~finite] < 0)).all(), "rows without keys: LSE -inf"
    error = (lse[finite] - expected_lse[finite]).abs().max().item()
    print(f"  lse max abs error {error:.2e}")
    assert error <= 0.05, f"LSE error {error}"
    scaled = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, sm_scale=0.05)
    expected = torch_varlen_attention(q.float(), k.float(), v.float(), cu_q, cu_k, False, 0.05)
    check(scaled, expected, 0.05, what="sm_scale 0.05")


def test_strided_q_view_of_a_fused_projection():
    torch.manual_seed(4)
    _, k, v, cu_q, cu_k = packed()
    fused = torch.randn(sum(LENGTHS_Q), 3 * 8, 128, dtype=torch.float16, device="cuda")
    q = fused[:, :8]  # strides (3 * 8 * 128, 128, 1)
    assert not q.is_contiguous()
    out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=True)
    same = sagegen.sageattn_varlen(q.contiguous(), k, v, cu_q, cu_k, 1000, 1000, is_causal=True)
    assert torch.equal(out, same)


def test_cuda_graph_capture_replays_with_new_offsets():
    torch.manual_seed(5)
    max_q = max_k = 1024
    total_q, total_k = 1500, 1800
    q = torch.randn(total_q, 8, 128, dtype=torch.float16, device="cuda")
    k, v = (torch.randn(total_k, 2, 128, dtype=torch.float16, device="cuda") for _ in range(2))
    cu_q, cu_k = offsets([500, 1000, 0]), offsets([800, 1000, 0])
    sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)  # warm: kernels built
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)
    for lengths_q, lengths_k in (([700, 300, 500], [1000, 300, 500]), ([1, 1024, 475], [1024, 1, 775])):
        cu_q.copy_(offsets(lengths_q))
        cu_k.copy_(offsets(lengths_k))
        graph.replay()
        torch.cuda.synchronize()
        eager = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=True)
        assert torch.equal(out, eager), f"replay with {lengths_q} / {lengths_k} differs from an eager call"
        check(out, reference(q, k, v, cu_q, cu_k, True), 0.05, what=f"graph replay {lengths_q}")


def test_repeated_calls_are_bound_and_written_offsets_are_checked_again():
    """The second call of a signature takes the bound path (new pointers, its own numbers); the offsets' values are
    checked once per (tensor, version): an in-place write (PyTorch bumps the version) is checked again."""
    torch.manual_seed(6)
    q, k, v, cu_q, cu_k = packed()
    first = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=True)
    for _ in range(2):
        q2, k2, v2 = (torch.randn_like(t) for t in (q, k, v))
        out = sagegen.sageattn_varlen(q2, k2, v2, cu_q, cu_k, 1000, 1000, is_causal=True)
        check(out, reference(q2, k2, v2, cu_q, cu_k, True), PRESET_BOUNDS["sage-b"], what="bound call, new tensors")
    assert not torch.equal(first, out)
    cu_q[-1] += 1  # past q's rows
    with raises(sagegen.SageArgumentError, match="^cu_seqlens_q:"):
        sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=True)
    cu_q[-1] -= 1
    again = sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 1000, is_causal=True)
    assert torch.equal(again, first)


def test_bad_offsets_are_refused_naming_the_argument():
    q, k, v, cu_q, cu_k = packed()
    cases = [
        ("cu_seqlens_q", lambda: sagegen.sageattn_varlen(q, k, v, cu_q.long(), cu_k, 1000, 1000)),
        ("cu_seqlens_k", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k.cpu(), 1000, 1000)),
        ("cu_seqlens_q", lambda: sagegen.sageattn_varlen(q, k, v, cu_q.flip(0), cu_k, 1000, 1000)),
        ("cu_seqlens_k", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k[:-1], 1000, 1000)),
        ("cu_seqlens_q", lambda: sagegen.sageattn_varlen(q[:-1], k, v, cu_q, cu_k, 1000, 1000)),
        ("max_seqlen_q", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 999, 1000)),
        ("max_seqlen_k", lambda: sagegen.sageattn_varlen(q, k, v, cu_q, cu_k, 1000, 0)),
    ]
    for argument, call in cases:
        with raises(sagegen.SageArgumentError, match=f"^{argument}:"):
            call()
    # The library's own checks (the offsets' values are never read there): an Attention called directly.
    attention = sagegen.Attention("sage-b", head_dim=128)
    with raises(sagegen.SageArgumentError, match="^cu_seqlens_kv:"):
        attention.varlen(q, k, v, cu_q, cu_k[:-1], 1000, 1000)
    with raises(sagegen.SageArgumentError, match="^lse:"):
        attention.varlen(q, k, v, cu_q, cu_k, 1000, 1000, lse=torch.empty(q.shape[0], 8, device="cuda"))


if __name__ == "__main__":
    sys.exit(run_tests(globals(), sys.argv))
