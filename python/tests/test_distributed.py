"""sagegen.distributed and the LSE merge without a GPU (issue 30): PyTorch on the CPU, several processes on gloo.

The ring and all-to-all algorithms run with the exact block functions (exact_block_forward / exact_block_backward)
in place of sagegen's kernels, so their results must equal exact attention over the full sequence to rounding:
forward O and LSE, and the gradients of q, k, v against PyTorch autograd through full attention. Also: the merge
(masked rows, layouts, the in-place form), the causal ring's block plan (every visible (query, key) pair exactly
once), the zig-zag sharding and the refusals, and the backward preset's pairing with a rotated forward preset
(`sagebwd-rot`, issue 25: in the ring backward and Ulysses' local attention, the kernels stood in for by exact
ones that record the preset they are called with). The GPU counterpart is test_distributed_gpu.py (torchrun).

    python3 python/tests/test_distributed.py [-k NAME]     (or pytest python/tests/test_distributed.py)

Skips (exit 0, saying so) where PyTorch or torch.distributed's gloo backend is missing.
"""

import math
import os
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import raises, run_tests  # noqa: E402

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    HAVE_TORCH = dist.is_available() and dist.is_gloo_available()
except ImportError:
    HAVE_TORCH = False

if HAVE_TORCH:
    import sagegen  # noqa: E402
    import sagegen.distributed as sd  # noqa: E402
    from sagegen import SageArgumentError  # noqa: E402


def _skip(reason):
    """Under pytest a skip; run as a script, a printed line (main counts the test as passed: nothing to fail)."""
    if os.environ.get("PYTEST_CURRENT_TEST"):
        import pytest
        pytest.skip(reason)
    print(f"  skipped: {reason}")
    return True


def _skip_without_torch():
    return not HAVE_TORCH and _skip("PyTorch with torch.distributed (gloo) is not installed")


def _qkv(seed, batch, heads, heads_kv, tokens, dim, layout="HND", dtype=None):
    generator = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32

    def make(h):
        shape = (batch, h, tokens, dim) if layout == "HND" else (batch, tokens, h, dim)
        return torch.randn(shape, generator=generator).to(dtype)
    return make(heads), make(heads_kv), make(heads_kv)


def _full(q, k, v, causal, layout, scale=None):
    """Exact attention over the full sequence in f64 (the references' reference)."""
    scale = scale or 1.0 / math.sqrt(q.shape[-1])
    return sd.exact_block_forward(q.double(), k.double(), v.double(), causal, scale, layout)


def _close(actual, expected, tolerance, what):
    actual, expected = actual.double(), expected.double()
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual)), f"{what}: non-finite entries differ"
    error = (actual[finite] - expected[finite]).abs().max().item() if finite.any() else 0.0
    scale = max(expected[finite].abs().max().item(), 1.0) if finite.any() else 1.0
    assert error <= tolerance * scale, f"{what}: max error {error:.3g} > {tolerance:.1g} x {scale:.3g}"
    return error


# ---- the merge -------------------------------------------------------------------------------------------------

def test_merge_of_key_parts_is_full_attention():
    if _skip_without_torch():
        return
    for layout in ("HND", "NHD"):
        q, k, v = _qkv(1, 2, 4, 2, 24, 16, layout, torch.float64)
        seq = 2 if layout == "HND" else 1
        full_o, full_lse = sd.exact_block_forward(q, k, v, False, 0.3, layout)
        bounds = [0, 5, 6, 17, 24]  # uneven parts, one of a single key
        parts = [sd.exact_block_forward(q, k.narrow(seq, a, b - a), v.narrow(seq, a, b - a), False, 0.3, layout)
                 for a, b in zip(bounds, bounds[1:])]
        o, lse = sagegen.merge_attention([p[0] for p in parts], [p[1] for p in parts], layout=layout)
        assert o.dtype == torch.float64 and lse.dtype == torch.float32
        _close(o, full_o, 1e-6, f"merged O ({layout})")
        _close(lse, full_lse, 1e-6, f"merged LSE ({layout})")
        # The running in-place form gives the same.
        acc_o, acc_lse = parts[0][0].float().clone(), parts[0][1].clone()
        for part_o, part_lse in parts[1:]:
            sagegen.merge_attention_into(acc_o, acc_lse, part_o, part_lse, layout=layout)
        _close(acc_o, full_o, 1e-5, f"running merge O ({layout})")
        _close(acc_lse, full_lse, 1e-6, f"running merge LSE ({layout})")


def test_merge_is_exact_for_masked_rows_and_stable_for_large_logits():
    if _skip_without_torch():
        return
    b, h, n, d = 1, 2, 6, 8
    minus_inf = float("-inf")
    o1, o2 = torch.randn(b, h, n, d, dtype=torch.float64), torch.randn(b, h, n, d, dtype=torch.float64)
    lse1 = torch.full((b, h, n), 3.0)
    lse2 = torch.full((b, h, n), 3.0)
    lse1[0, 0, 0] = minus_inf   # row masked in part 1 only: the result is part 2's row
    o1[0, 0, 0] = float("nan")  # whatever a masked part holds, merge_attention ignores it
    lse1[0, 1, 1] = lse2[0, 1, 1] = minus_inf  # masked in both: LSE -inf, O 0
    o1[0, 1, 1] = o2[0, 1, 1] = 0.0
    lse1[0, 0, 2], lse2[0, 0, 2] = 5000.0, 5001.0  # exp would overflow unshifted (both exact in f32)
    o, lse = sagegen.merge_attention([o1, o2], [lse1, lse2])
    assert torch.isfinite(o).all()
    assert torch.equal(o[0, 0, 0], o2[0, 0, 0]) and lse[0, 0, 0].item() == 3.0
    assert lse[0, 1, 1].item() == minus_inf and torch.equal(o[0, 1, 1], torch.zeros(d, dtype=o.dtype))
    w2 = math.e / (1.0 + math.e)
    _close(lse[0, 0, 2], torch.tensor(5000.0 + math.log1p(math.e)), 1e-6, "shifted LSE")
    _close(o[0, 0, 2], (1.0 - w2) * o1[0, 0, 2] + w2 * o2[0, 0, 2], 1e-6, "shifted O")
    _close(o[0, 0, 3], 0.5 * (o1[0, 0, 3] + o2[0, 0, 3]), 1e-6, "equal weights")
    # The in-place form: a masked part (O = 0, as the kernels write it) adds nothing; all-masked stays -inf, 0.
    acc_o, acc_lse = torch.zeros(b, h, n, d), torch.full((b, h, n), minus_inf)
    o1[0, 0, 0] = 0.0
    sagegen.merge_attention_into(acc_o, acc_lse, o1, lse1)
    sagegen.merge_attention_into(acc_o, acc_lse, o2, lse2)
    assert acc_lse[0, 1, 1].item() == minus_inf and torch.equal(acc_o[0, 1, 1], torch.zeros(d))
    _close(acc_o[0, 0, 0], o2[0, 0, 0], 1e-6, "in-place masked row")
    _close(acc_o[0, 0, 2], (1.0 - w2) * o1[0, 0, 2] + w2 * o2[0, 0, 2], 1e-6, "in-place shifted O")
    assert torch.isfinite(acc_o).all()


def test_merge_pair_writes_into_the_given_output():
    """sagegen._lse.merge_pair, the ring's step (on CPU tensors: its torch path): into a new output of another dtype
    and in place into part A, a masked part's NaN ignored; mismatched arguments refused by name."""
    if _skip_without_torch():
        return
    from sagegen._lse import merge_pair
    b, h, n, d = 1, 2, 6, 8
    for layout in ("HND", "NHD"):
        shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
        o1, o2 = torch.randn(shape), torch.randn(shape)
        lse1, lse2 = torch.randn(b, h, n), torch.randn(b, h, n)
        lse1[0, 0, 0] = float("-inf")
        o1[0, 0, 0] = float("nan")  # row (b 0, h 0, n 0) in both layouts
        expected_o, expected_lse = sagegen.merge_attention([o1, o2], [lse1, lse2], layout=layout)
        out, out_lse = torch.empty(shape, dtype=torch.float64), torch.empty(b, h, n)
        merge_pair(o1, lse1, o2, lse2, out, out_lse, layout)
        _close(out, expected_o, 1e-6, f"merge_pair into a new f64 output ({layout})")
        _close(out_lse, expected_lse, 1e-6, f"merge_pair LSE ({layout})")
        acc, acc_lse = o1.clone(), lse1.clone()
        merge_pair(acc, acc_lse, o2, lse2, acc, acc_lse, layout)
        _close(acc, expected_o, 1e-6, f"merge_pair in place ({layout})")
        _close(acc_lse, expected_lse, 1e-6, f"merge_pair in place, LSE ({layout})")
    with raises(SageArgumentError, contains="o_b:"):
        merge_pair(o1, lse1, o2[..., :4], lse2, out, out_lse, "NHD")
    with raises(SageArgumentError, contains="lse_out: expected float32"):
        merge_pair(o1, lse1, o2, lse2, out, out_lse.double(), "NHD")


def test_merge_refuses_mismatched_arguments():
    if _skip_without_torch():
        return
    o, lse = torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4)
    with raises(SageArgumentError, contains="lses:"):
        sagegen.merge_attention([o, o], [lse])
    with raises(SageArgumentError, contains="outputs[1]:"):
        sagegen.merge_attention([o, o], [lse, torch.zeros(1, 4, 2)])
    with raises(SageArgumentError, contains="layout:"):
        sagegen.merge_attention([o], [lse], layout="BHSD")
    with raises(SageArgumentError, contains="acc_output:"):
        sagegen.merge_attention_into(o.half(), lse, o, lse)
    # NHD: the LSE stays [b, h, n] while O is [b, n, h, d].
    sagegen.merge_attention([o.transpose(1, 2)], [lse], layout="NHD")


def test_merge_compiles():
    if _skip_without_torch():
        return
    if not hasattr(torch, "compile"):
        _skip("torch.compile is not in this PyTorch")
        return
    o = [torch.randn(1, 2, 8, 4) for _ in range(3)]
    lse = [torch.randn(1, 2, 8) for _ in range(3)]
    lse[1][0, 0, 0] = float("-inf")
    eager = sagegen.merge_attention(o, lse)
    compiled = torch.compile(sagegen.merge_attention, fullgraph=True)(o, lse)
    for a, b in zip(eager, compiled):
        _close(b, a, 1e-6, "compiled merge")


# ---- the block plan and the sharding ---------------------------------------------------------------------------

def test_causal_ring_plan_covers_the_causal_mask_exactly_once():
    if _skip_without_torch():
        return
    for world in range(1, 9):
        tokens = 2 * world * 3
        local = tokens // world
        seen = torch.zeros(tokens, tokens, dtype=torch.int64)
        work = []
        for rank in range(world):
            mine = torch.tensor(sd.zigzag_positions(rank, world, tokens))
            step_work = []
            for step in range(world):
                source = (rank - step) % world
                theirs = torch.tensor(sd.zigzag_positions(source, world, tokens))
                rows, cols, causal = sd.ring_block(rank, source, world, True, local)
                q_pos, k_pos = mine[rows], theirs[cols]
                block = torch.ones(len(q_pos), len(k_pos), dtype=torch.int64)
                if causal:  # bottom-right = top-left for a square block
                    assert len(q_pos) == len(k_pos)
                    block = torch.tril(block)
                visible = block.bool()
                # A block's mask must be the global causal mask restricted to it (no pair seen wrongly)...
                assert torch.equal(visible, k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)), (world, rank, source)
                seen[q_pos.unsqueeze(1).expand_as(block)[visible], k_pos.unsqueeze(0).expand_as(block)[visible]] += 1
                step_work.append(block.numel())
            work.append(step_work)
        # ... and together they see every causal pair exactly once.
        assert torch.equal(seen, torch.tril(torch.ones(tokens, tokens, dtype=torch.int64))), world
        # Load balance: at each step every rank computes a block of the same size.
        for step in range(1, world):
            assert len({work[rank][step] for rank in range(world)}) == 1, (world, step, work)


def test_non_causal_plan_is_whole_blocks():
    if _skip_without_torch():
        return
    assert sd.ring_block(2, 0, 4, False, 7) == (slice(0, 7), slice(0, 7), False)
    with raises(SageArgumentError, contains="q: causal ring attention needs an even number"):
        sd.ring_block(1, 0, 2, True, 7)


def test_zigzag_and_contiguous_sharding_round_trip_and_refuse_uneven_lengths():
    if _skip_without_torch():
        return
    x = torch.arange(2 * 3 * 24 * 2).view(2, 3, 24, 2)
    for world in (1, 2, 3, 4, 6):
        shards = [sd.zigzag_shard(x, rank, world, dim=2) for rank in range(world)]
        assert torch.equal(sd.zigzag_unshard(shards, dim=2), x)
        positions = sd.zigzag_positions(1 % world, world, 24)
        assert torch.equal(shards[1 % world], x[:, :, positions])
        parts = [sd.shard_sequence(x, rank, world, dim=2) for rank in range(world)]
        assert torch.equal(torch.cat(parts, dim=2), x)
    assert sd.zigzag_positions(0, 2, 8) == [0, 1, 6, 7] and sd.zigzag_positions(1, 2, 8) == [2, 3, 4, 5]
    with raises(SageArgumentError, contains="x: 24 tokens (dimension 2) do not split into 2 * world_size = 10"):
        sd.zigzag_shard(x, 0, 5, dim=2)
    with raises(SageArgumentError, contains="x: 24 tokens (dimension 1) do not split into world_size = 5"):
        sd.shard_sequence(x.transpose(1, 2), 0, 5, dim=1)
    with raises(SageArgumentError, contains="rank:"):
        sd.zigzag_shard(x, 4, 4, dim=2)


def test_refusals_before_any_communication():
    if _skip_without_torch():
        return
    q, k, v = _qkv(0, 1, 2, 2, 8, 8)
    if not dist.is_initialized():
        with raises(SageArgumentError, contains="group: torch.distributed is not initialized"):
            sd.ring_attention(q, k, v, attention_fn=sd.exact_block_forward)
        with raises(SageArgumentError, contains="group: torch.distributed is not initialized"):
            sd.ulysses_attention(q, k, v, attention_fn=sd.exact_block_forward)
    with raises(SageArgumentError, contains="q: expected a 4-D tensor"):
        sd.ring_attention(q[0], k, v)
    with raises(SageArgumentError, contains="v: expected k's shape"):
        sd.ring_attention(q, k, v[:, :, :4])
    with raises(SageArgumentError, contains="k: causal ring attention needs q's and k's shards to hold the same"):
        sd.ring_attention(q, k[:, :, :4], v[:, :, :4], is_causal=True)
    with raises(SageArgumentError, contains="sm_scale:"):
        sd.ring_attention(q, k, v, sm_scale=-1.0)
    with raises(SageArgumentError, contains="tensor_layout:"):
        sd.ulysses_attention(q, k, v, tensor_layout="BSHD")


def test_rotated_forward_preset_pairs_with_sagebwd_rot_in_the_ring_backward():
    """ring_attention's block functions: the backward preset pairs with the forward one through the single-GPU
    path's helper (sagegen._backward.paired_presets), so a rotated forward gets sagebwd-rot. A pure function: no
    GPU, no process group."""
    if _skip_without_torch():
        return
    from sagegen._backward import paired_presets
    pick = sd._ring_block_functions
    for preset, rotate, forward, backward in (("sage-b", None, "sage-b", "sagebwd"),
                                              ("sage2-fp8", None, "sage2-fp8", "sagebwd"),
                                              ("sage2-fp8", False, "sage2-fp8", "sagebwd"),
                                              ("sage2-fp8-rot", None, "sage2-fp8-rot", "sagebwd-rot-qks"),
                                              ("sage-b-rot", True, "sage-b-rot", "sagebwd-rot-qks"),
                                              ("sage-b", True, "sage-b-rot", "sagebwd-rot-qks"),
                                              ("sage2-fp8", True, "sage2-fp8-rot", "sagebwd-rot-qks")):
        assert paired_presets(preset, rotate) == (forward, backward)  # the same pairing as sagebwd_attention's
        forward_fn, backward_fn = pick(preset, rotate, None, None, None)
        assert backward_fn.preset == backward, (preset, rotate, backward_fn.preset)
        assert forward_fn.__qualname__ == f"sage_block_forward({forward!r})", (preset, rotate, forward_fn)
        # A forward block function given: the default backward still pairs with the preset.
        given_fn, backward_fn = pick(preset, rotate, None, sd.exact_block_forward, None)
        assert given_fn is sd.exact_block_forward and backward_fn.preset == backward
    assert pick("sage-b-rot", None, None, sd.exact_block_forward, sd.exact_block_backward) == \
        (sd.exact_block_forward, sd.exact_block_backward)
    assert sd.sage_block_backward().preset == "sagebwd"
    # Refusals, naming the argument, before any communication (no process group needed).
    q, k, v = _qkv(0, 1, 2, 2, 8, 8)
    with raises(SageArgumentError, contains="rotate: expected None, True or False, got 'yes'"):
        sd.ring_attention(q, k, v, rotate="yes")
    with raises(SageArgumentError, contains="rotate: False, but forward_preset 'sage2-fp8-rot' rotates Q and K"):
        sd.ring_attention(q, k, v, preset="sage2-fp8-rot", rotate=False)
    with raises(SageArgumentError, contains="rotate: True, but the block functions given replace sagegen's kernels"):
        sd.ring_attention(q, k, v, rotate=True, attention_fn=sd.exact_block_forward,
                          attention_backward_fn=sd.exact_block_backward)
    with raises(SageArgumentError, contains="rotate: True, but the block functions given replace sagegen's kernels"):
        sd.ulysses_attention(q, k, v, rotate=True, attention_fn=sd.exact_block_forward)
    with raises(SageArgumentError, contains="rotate: False, but forward_preset 'sage-b-rot'"):
        sd.ulysses_attention(q, k, v, preset="sage-b-rot", rotate=False)
    with raises(SageArgumentError, contains="preset: expected a preset name"):
        sd.ring_attention(q, k, v, preset=None)
    # rotate=True on a preset without a rotated form: the library refuses the name it made (on the first block,
    # the same on every rank); the error names rotate. The library's refusal is stood in for here.
    def unknown(name, tunables=None):
        def forward(*args):
            raise SageArgumentError(f"config.preset: unknown preset '{name}' (`sagegen list` lists them)")
        return forward
    saved = sd.sage_block_forward
    sd.sage_block_forward = unknown
    try:
        forward_fn, backward_fn = pick("sage2-int4", True, None, None, None)
        assert backward_fn.preset == "sagebwd-rot-qks"
        with raises(SageArgumentError, contains="rotate: True, but preset 'sage2-int4' has no rotated form"):
            forward_fn(q, k, v, False, 0.3, "HND")
        forward_fn, _ = pick("sage2-int4", None, None, None, None)  # not made by rotate: the library's own error
        with raises(SageArgumentError, contains="config.preset: unknown preset 'sage2-int4'"):
            forward_fn(q, k, v, False, 0.3, "HND")
    finally:
        sd.sage_block_forward = saved


# ---- several processes on gloo ---------------------------------------------------------------------------------

def _grads_of_full(q, k, v, causal, layout, grad_out):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    o, _ = sd.exact_block_forward(q, k, v, causal, 1.0 / math.sqrt(q.shape[-1]), layout)
    o.backward(grad_out.double())
    return q.grad, k.grad, v.grad


def _check_group(group, world, rank, tag):
    """Ring (zig-zag when causal) and Ulysses on one group against exact attention over the full sequence."""
    results = []
    for layout in ("HND", "NHD"):
        seq, heads = (2, 1) if layout == "HND" else (1, 2)
        for causal in (False, True):
            for heads_kv in (12, 6, 2):  # MHA, GQA whose KV heads split over 2 and 3 ranks, and over none
                q, k, v = _qkv(7 + heads_kv, 2, 12, heads_kv, 12 * world, 8, layout)
                grad_out = _qkv(99, 2, 12, 12, 12 * world, 8, layout)[0]
                full_o, full_lse = _full(q, k, v, causal, layout)
                full_grads = _grads_of_full(q, k, v, causal, layout, grad_out)
                for method in ("ring", "ulysses"):
                    zigzag = method == "ring" and causal
                    shard = ((lambda t: sd.zigzag_shard(t, rank, world, dim=seq)) if zigzag
                             else (lambda t: sd.shard_sequence(t, rank, world, dim=seq)))
                    local = [shard(t).requires_grad_() for t in (q, k, v)]
                    if method == "ring":
                        o, lse = sd.ring_attention(*local, group=group, is_causal=causal, tensor_layout=layout,
                                                   return_lse=True, attention_fn=sd.exact_block_forward,
                                                   attention_backward_fn=sd.exact_block_backward)
                    else:
                        o, lse = sd.ulysses_attention(*local, group=group, is_causal=causal, tensor_layout=layout,
                                                      return_lse=True, attention_fn=sd.exact_block_forward)
                    assert o.shape == local[0].shape and o.dtype == q.dtype
                    o.backward(shard(grad_out))
                    gathered_o = sd.gather_sequence(o.detach(), group, dim=seq, zigzag=zigzag)
                    gathered_lse = sd.gather_sequence(lse, group, dim=2, zigzag=zigzag)
                    name = f"{tag} {method} {layout} causal={causal} heads 12/{heads_kv}"
                    _close(gathered_o, full_o, 2e-5, name + " O")
                    _close(gathered_lse, full_lse, 2e-5, name + " LSE")
                    for grad_name, tensor, expected in zip("qkv", local, full_grads):
                        gathered = sd.gather_sequence(tensor.grad, group, dim=seq, zigzag=zigzag)
                        _close(gathered, expected, 5e-5, f"{name} d{grad_name}")
                    results.append(name)
    return results


def _check_rotated_backward(group, world, rank):
    """The backward preset that sagegen's kernels are called with after a rotated forward preset: the ring backward's
    blocks and Ulysses' local SageBwd, the kernels stood in for by exact ones that record their preset (so no GPU);
    the gradients must still be exact."""
    from sagegen import _backward
    calls = []

    def backward_body(q, k, v, o, lse, d_o, causal, scale, preset="sagebwd"):
        calls.append(preset)
        return sd.exact_block_backward(q, k, v, o, lse, d_o, causal, scale, "HND")

    def sagebwd_attention(q, k, v, is_causal=False, scale=None, forward_preset="sage-b", return_lse=False,
                          rotate=None):
        calls.append(_backward.paired_presets(forward_preset, rotate)[1])
        o, lse = sd.exact_block_forward(q, k, v, is_causal, scale, "HND")
        return (o, lse) if return_lse else o

    saved = _backward._backward_body, _backward.sagebwd_attention
    _backward._backward_body, _backward.sagebwd_attention = backward_body, sagebwd_attention
    results = []
    try:
        for layout in ("HND", "NHD"):
            seq = 2 if layout == "HND" else 1
            q, k, v = _qkv(5, 1, 12, 6, 4 * world, 8, layout)
            grad_out = _qkv(55, 1, 12, 12, 4 * world, 8, layout)[0]
            full_grads = _grads_of_full(q, k, v, True, layout, grad_out)
            for preset, rotate, expected in (("sage2-fp8-rot", None, "sagebwd-rot-qks"),
                                             ("sage-b-rot", None, "sagebwd-rot-qks"),
                                             ("sage-b", True, "sagebwd-rot-qks"),
                                             ("sage-b", None, "sagebwd"), ("sage2-fp8", False, "sagebwd")):
                for method in ("ring", "ulysses"):
                    shard = ((lambda t: sd.zigzag_shard(t, rank, world, dim=seq)) if method == "ring"
                             else (lambda t: sd.shard_sequence(t, rank, world, dim=seq)))
                    local = [shard(t).requires_grad_() for t in (q, k, v)]
                    calls.clear()
                    if method == "ring":  # sagegen's forward replaced, its backward kept: the preset still pairs
                        o = sd.ring_attention(*local, group=group, is_causal=True, tensor_layout=layout, preset=preset,
                                              rotate=rotate, attention_fn=sd.exact_block_forward)
                    else:
                        o = sd.ulysses_attention(*local, group=group, is_causal=True, tensor_layout=layout,
                                                 preset=preset, rotate=rotate)
                    o.backward(shard(grad_out))
                    name = f"{method} {layout} preset={preset} rotate={rotate}"
                    # The ring: one backward block per step; Ulysses: one local SageBwd.
                    assert calls == [expected] * (world if method == "ring" else 1), (name, calls)
                    for grad_name, tensor, expected_grad in zip("qkv", local, full_grads):
                        gathered = sd.gather_sequence(tensor.grad, group, dim=seq, zigzag=method == "ring")
                        _close(gathered, expected_grad, 5e-5, f"{name} d{grad_name}")
                    results.append(name)
    finally:
        _backward._backward_body, _backward.sagebwd_attention = saved
    return results


def _worker(rank, world, init_file, queue):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        done = _check_group(None, world, rank, f"world {world}")
        done += _check_rotated_backward(None, world, rank)
        if world == 4:  # two rings in subgroups {0, 1} and {2, 3}: the group's ranks are mapped to global ones
            groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            done += _check_group(groups[rank // 2], 2, rank % 2, "subgroup of 2")
        # A refusal that needs the group: Ulysses' heads must split over the ranks.
        q = torch.randn(1, world + 1, 4, 8)
        with raises(SageArgumentError, contains=f"q: {world + 1} heads do not split over {world} ranks"):
            sd.ulysses_attention(q, q, q, attention_fn=sd.exact_block_forward)
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, None, len(done)))
    except BaseException:  # noqa: B902 - reported to the parent, which fails the test
        queue.put((rank, traceback.format_exc(), 0))


def _run_world(world):
    context = mp.get_context("spawn")
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as directory:
        init_file = os.path.join(directory, "init")
        processes = [context.Process(target=_worker, args=(rank, world, init_file, queue)) for rank in range(world)]
        for process in processes:
            process.start()
        reports = [queue.get(timeout=600) for _ in range(world)]
        for process in processes:
            process.join(timeout=60)
    failures = [f"rank {rank}:\n{error}" for rank, error, _ in sorted(reports) if error]
    assert not failures, "\n".join(failures)
    counts = {count for _, _, count in reports}
    assert len(counts) == 1 and counts.pop() > 0, reports
    return reports


def test_ring_and_ulysses_on_2_ranks_equal_full_attention():
    if _skip_without_torch():
        return
    _run_world(2)


def test_ring_and_ulysses_on_3_ranks_equal_full_attention():
    if _skip_without_torch():
        return
    _run_world(3)


def test_ring_and_ulysses_on_4_ranks_and_subgroups_equal_full_attention():
    if _skip_without_torch():
        return
    _run_world(4)


def main(argv):
    if not HAVE_TORCH:
        print("test_distributed: skipped (PyTorch with torch.distributed/gloo is not installed)")
        return 0
    return run_tests(globals(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
