"""The front doors on a GPU (issue 28 item 3) and the host fast path (issue 24 item 4):

- transformers: a small Llama-style model (GQA, random weights from a config, nothing downloaded) with
  attn_implementation="sagegen" against "sdpa": logits cosine, sagegen really called, a padded batch falling back;
  a packed (padding-free) batch of several sequences (position_ids restarting, with and without a KV cache, and
  FlashAttention's cu_seq_lens kwargs) on sagegen.sageattn_varlen against "sdpa" run on each sequence alone, and
  its fallbacks (float32: SDPA per sequence; a sliding window: transformers' SDPA with the packing's mask);
- diffusers-style calls (NHD, sm_scale, return_lse) through sagegen.integrations.sageattn against PyTorch in f32,
  and diffusers' own "sage" backend after patch_diffusers() where diffusers is installed;
- fallbacks once per reason (float32, CPU tensors, a head dim without a kernel);
- Attention's call plans across changing shapes, strides, layouts and outputs: every cached call equal to a fresh
  Attention's and close to PyTorch; the eager sageattn route equal to the op's; host time per call printed.

    PYTHONPATH=python python3 python/tests/test_frontdoors_gpu.py [-k NAME]

Skips (exit 0, saying so) without a CUDA device; a part whose package (transformers, diffusers) is missing says
SKIP for that part. Ends with a summary line: "N passed, N failed, N skipped".
"""

import math
import os
import sys
import time
import warnings

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # no PyTorch: nothing here can run
    print("test_frontdoors_gpu.py: SKIPPED, PyTorch is not installed")
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import Skip, run_tests  # noqa: E402
import sagegen  # noqa: E402
from sagegen import integrations  # noqa: E402


def cosine(a, b):
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def reference(q, k, v, layout="HND", is_causal=False, scale=None):
    """(out, lse) in f32 from the scores: top-left causal as SDPA; GQA by repeating K/V."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.float() for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.softmax(scores, -1) @ v
    return (out.transpose(1, 2) if layout == "NHD" else out), torch.logsumexp(scores, -1)


def warnings_of(call, door):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [str(w.message) for w in caught if str(w.message).startswith(door)]


# ---- transformers ----

def _llama(attn_implementation):
    try:
        import transformers
    except ImportError:
        raise Skip("transformers is not installed")
    config = transformers.LlamaConfig(vocab_size=1000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    return model.to(device="cuda", dtype=torch.float16).eval()


def test_transformers_llama_sagegen_matches_sdpa():
    name = integrations.register_transformers()
    assert name == "sagegen"
    sdpa_model, sage_model = _llama("sdpa"), _llama("sagegen")
    sage_model.load_state_dict(sdpa_model.state_dict())
    assert sage_model.config._attn_implementation == "sagegen"
    calls = []
    strict = integrations._strict_sageattn
    integrations._strict_sageattn = lambda *a, **kw: calls.append(a[3:6]) or strict(*a, **kw)
    try:
        ids = torch.randint(0, 1000, (2, 512), device="cuda")
        with torch.no_grad():
            expected = sdpa_model(ids).logits
            got = sage_model(ids).logits
        assert len(calls) == 2, f"expected sagegen in both layers, saw {calls}"
        assert all(call[:2] == ("HND", True) for call in calls), calls  # causal prefill, as SDPA decides it
        c = cosine(got, expected)
        print(f"    logits cosine sagegen vs sdpa: {c:.5f}; argmax agreement "
              f"{(got.argmax(-1) == expected.argmax(-1)).float().mean().item():.3f}")
        assert c >= 0.99, c
        # A padded batch: the mask goes to transformers' SDPA, once with a warning; the logits are SDPA's.
        mask = torch.ones_like(ids)
        mask[0, :100] = 0
        calls.clear()
        with torch.no_grad():
            expected = sdpa_model(ids, attention_mask=mask).logits
            got, said = warnings_of(lambda: sage_model(ids, attention_mask=mask).logits, "sagegen (transformers")
        assert calls == [] and len(said) == 1 and "attn_mask" in said[0], (calls, said)
        assert cosine(got[1], expected[1]) > 0.9999
    finally:
        integrations._strict_sageattn = strict


def test_transformers_llama_packed_sequences_match_sdpa_per_sequence():
    integrations.register_transformers()
    sdpa_model, sage_model = _llama("sdpa"), _llama("sagegen")
    sage_model.load_state_dict(sdpa_model.state_dict())
    lengths = [300, 1, 77, 512, 130]  # a one-token sequence included
    torch.manual_seed(5)
    ids = [torch.randint(0, 1000, (1, n), device="cuda") for n in lengths]
    packed_ids = torch.cat(ids, dim=1)
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]  # restarting at 0
    cu = torch.tensor([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        expected = torch.cat([sdpa_model(sequence).logits for sequence in ids], dim=1)  # each sequence alone
        across = sdpa_model(packed_ids, position_ids=position_ids).logits  # what attending across would give
    print(f"    (sdpa on the packed batch with a cache, attending across sequences: cosine vs per sequence "
          f"{cosine(across, expected):.4f})")
    calls = []
    varlen = integrations._sageattn_varlen
    integrations._sageattn_varlen = lambda *a, **kw: calls.append((a[3].tolist(), a[5], kw)) or varlen(*a, **kw)
    cases = [("position_ids restarting, with a KV cache (no mask)", dict(position_ids=position_ids)),
             ("position_ids restarting, use_cache=False (transformers' packed mask)",
              dict(position_ids=position_ids, use_cache=False)),
             ("FlashAttention's kwargs (DataCollatorWithFlattening)",
              dict(position_ids=position_ids, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                   max_length_q=max(lengths), max_length_k=max(lengths)))]
    try:
        for label, kwargs in cases:
            calls.clear()
            try:
                with torch.no_grad():
                    got, said = warnings_of(lambda: sage_model(packed_ids, **kwargs).logits, "sagegen")
            except TypeError as error:  # a transformers that does not pass the flash kwargs down to attention
                if "cu_seq_lens_q" not in kwargs:
                    raise
                print(f"    {label}: SKIP, this transformers refuses them ({error})")
                continue
            assert said == [], (label, said)
            assert len(calls) == 2, f"{label}: expected sagegen.sageattn_varlen in both layers, saw {calls}"
            assert all(call[0] == cu.tolist() and call[1] == max(lengths) and call[2]["is_causal"] for call in calls), \
                (label, calls)
            per_sequence = [cosine(a, b) for a, b in zip(got.split(lengths, dim=1), expected.split(lengths, dim=1))]
            rel_l1 = ((got.float() - expected.float()).abs().sum() / expected.float().abs().sum()).item()
            print(f"    {label}: logits cosine {cosine(got, expected):.5f} (per sequence min {min(per_sequence):.5f}), "
                  f"rel-L1 {rel_l1:.4f}; argmax agreement "
                  f"{(got.argmax(-1) == expected.argmax(-1)).float().mean().item():.3f}")
            assert min(per_sequence) >= 0.99, (label, per_sequence)
    finally:
        integrations._sageattn_varlen = varlen


def test_transformers_packed_fallbacks_attend_per_sequence():
    try:
        import transformers  # noqa: F401  (the mask fallback calls its SDPA function)
    except ImportError:
        raise Skip("transformers is not installed")
    torch.manual_seed(6)
    lengths, window = [40, 1, 97, 64], 16
    total = sum(lengths)
    position_ids = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    query = torch.randn(1, 8, total, 64, device="cuda")
    key, value = (torch.randn(1, 2, total, 64, device="cuda") for _ in range(2))
    module = type("Module", (), {"is_causal": True, "num_key_value_groups": 4})()  # GQA as transformers' modules

    def expected(q, k, v, sliding_window=None):
        """Each sequence alone: SDPA on its rows with its own causal (and window) mask."""
        out, start = torch.empty(1, total, 8, 64, device="cuda", dtype=q.dtype), 0
        for n in lengths:
            rows = torch.arange(n, device="cuda")
            keep = rows[None, :] <= rows[:, None]
            if sliding_window is not None:
                keep &= rows[:, None] - rows[None, :] < sliding_window
            ks, vs = (t[:, :, start:start + n].repeat_interleave(4, dim=1) for t in (k, v))
            out[:, start:start + n] = F.scaled_dot_product_attention(q[:, :, start:start + n], ks, vs,
                                                                     attn_mask=keep).transpose(1, 2)
            start += n
        return out
    door = "sagegen (transformers attention)"
    # float32: sagegen cannot run it; one SDPA per sequence, one warning.
    (got, _), said = warnings_of(lambda: integrations.transformers_attention(module, query, key, value, None,
                                                                             position_ids=position_ids), door)
    assert len(said) == 1 and "packed sequences: dtype torch.float32" in said[0], said
    assert (got - expected(query, key, value)).abs().max().item() < 1e-3
    # A window shorter than a sequence: transformers' SDPA function with the packing's mask and the window.
    q16, k16, v16 = (t.half() for t in (query, key, value))
    (got, _), said = warnings_of(lambda: integrations.transformers_attention(
        module, q16, k16, v16, None, position_ids=position_ids, sliding_window=window), door)
    assert len(said) == 1 and f"sliding_window={window}" in said[0], said
    reference = expected(q16.float(), k16.float(), v16.float(), window)
    assert (got.float() - reference).abs().max().item() < 2e-2, (got.float() - reference).abs().max().item()
    assert cosine(got, reference) > 0.9999


# ---- diffusers-style calls ----

def test_diffusers_style_nhd_sm_scale_lse():
    torch.manual_seed(1)
    for dtype in (torch.float16, torch.bfloat16):
        for is_causal in (False, True):
            q, k, v = (torch.randn(2, 1024, 8, 128, dtype=dtype, device="cuda") for _ in range(3))
            scale = 0.05
            out, lse = integrations.sageattn(q=q, k=k, v=v, tensor_layout="NHD", is_causal=is_causal, sm_scale=scale,
                                             return_lse=True)
            expected, expected_lse = reference(q, k, v, "NHD", is_causal, scale)
            assert out.shape == q.shape and lse.shape == (2, 8, 1024) and lse.dtype == torch.float32
            assert cosine(out, expected) >= 0.995, cosine(out, expected)
            assert (lse - expected_lse).abs().max().item() < 0.05, (lse - expected_lse).abs().max().item()
            plain = integrations.sageattn(q, k, v, tensor_layout="NHD", is_causal=is_causal, sm_scale=scale)
            assert torch.equal(plain, out) or cosine(plain, out) > 0.9999  # the no-LSE kernel may differ by rounding
    # What ComfyUI passes: attn_mask=None, is_causal=False, tensor_layout; what SageAttention callers add.
    q, k, v = (torch.randn(1, 512, 8, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    out = integrations.sageattn(q, k, v, attn_mask=None, is_causal=False, tensor_layout="NHD", smooth_k=True,
                                smooth_v=False, dropout_p=0.0)
    assert cosine(out, reference(q, k, v, "NHD")[0]) >= 0.995


def test_diffusers_sage_backend_after_patch():
    try:
        from diffusers.models import attention_dispatch
    except ImportError:
        raise Skip("diffusers is not installed")
    integrations.patch_diffusers()
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 1024, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    out = attention_dispatch.dispatch_attention_fn(q, k, v, backend="sage")
    assert cosine(out, reference(q, k, v, "NHD")[0]) >= 0.995


# ---- fallbacks ----

def test_fallbacks_once_per_reason():
    door = "sagegen.integrations.sageattn"
    q, k, v = (torch.randn(1, 8, 256, 64, dtype=torch.float16, device="cuda") for _ in range(3))
    q96, k96, v96 = (torch.randn(1, 8, 256, 96, dtype=torch.float16, device="cuda") for _ in range(3))
    cases = [("float32", (q.float(), k.float(), v.float()), True),
             ("CPU", (q.cpu().float(), k.cpu().float(), v.cpu().float()), True),
             ("head dim 96", (q96, k96, v96), False)]  # runs on the sm80 schedule since issue 28: no fallback
    for label, inputs, must_fall_back in cases:
        first, said_first = warnings_of(lambda: integrations.sageattn(*inputs), door)
        second, said_second = warnings_of(lambda: integrations.sageattn(*inputs), door)
        assert said_second == [], (label, said_second)
        assert len(said_first) == (1 if must_fall_back else 0), said_first
        print(f"    {label}: {said_first[0] if said_first else 'ran on sagegen (no fallback needed)'}")
        assert cosine(first.float().cpu(), reference(*inputs)[0].cpu()) >= 0.995
        assert torch.equal(first, second)
    # A caller's mistake is raised, never hidden by a fallback.
    try:
        integrations.sageattn(q, k[:, :3], v[:, :3])
    except sagegen.SageArgumentError as error:
        assert str(error).startswith("k:"), str(error)
    else:
        raise AssertionError("3 kv heads for 8 q heads was not refused")


# ---- the host fast path: Attention's call plans ----

def test_call_plans_across_shapes_strides_and_outputs():
    torch.manual_seed(3)
    cached = sagegen.Attention("sage-b", head_dim=128, causal=True, lse=True)

    def fresh(*args, **kwargs):
        return sagegen.Attention("sage-b", head_dim=128, causal=True, lse=True)(*args, **kwargs)

    def inputs(n, layout="HND"):
        shape = (2, 8, n, 128) if layout == "HND" else (2, n, 8, 128)
        return tuple(torch.randn(shape, dtype=torch.float16, device="cuda") for _ in range(3))

    calls = []
    for n in (256, 384, 256):  # back to the first shape: its plan again, with new pointers
        q, k, v = inputs(n)
        calls.append(((q, k, v), {}))
    q, k, v = inputs(256, "NHD")
    calls.append(((q, k, v), {"layout": "NHD"}))
    calls.append(((q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)), {}))  # same shape, NHD strides
    q, k, v = inputs(256)
    out = torch.empty(2, 256, 8, 128, dtype=torch.float16, device="cuda").transpose(1, 2)  # a strided out
    calls.append(((q, k, v), {"out": out}))
    calls.append(((q, k, v), {}))
    for args, kwargs in calls:
        got, got_lse = cached(*args, **kwargs)
        want, want_lse = fresh(*args, **{key: (torch.empty_like(val) if key == "out" else val)
                                         for key, val in kwargs.items()})
        assert torch.equal(got, want) and torch.equal(got_lse, want_lse)
        expected, expected_lse = reference(*args, kwargs.get("layout", "HND"), True)
        assert cosine(got, expected) >= 0.995
        if "out" in kwargs:
            assert got is kwargs["out"]
    plans = len(cached._local.plans)
    assert plans == 5, plans  # 256, 384, NHD, HND-with-NHD-strides, strided out


def test_eager_sageattn_equals_the_op_and_host_time():
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 8, 128, 128, dtype=torch.float16, device="cuda") for _ in range(3))
    for return_lse in (False, True):
        fast = sagegen.sageattn(q, k, v, is_causal=True, return_lse=return_lse)
        op = torch.ops.sagegen.attention(q, k, v, None, "sage-b", True, True, "HND", return_lse, "")
        if return_lse:
            assert torch.equal(fast[0], op[0]) and torch.equal(fast[1], op[1])
        else:
            assert torch.equal(fast, op[0])

    def per_call_us(run, calls=2000):
        for _ in range(50):
            run()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / calls * 1e6
    attention = sagegen.Attention("sage-b", head_dim=128)
    out, workspace = torch.empty_like(q), torch.empty(max(attention.workspace_bytes(q, k), 1), dtype=torch.uint8,
                                                      device="cuda")
    print(f"    host us/call at b=1 h=8 N=128 d=128: sdpa {per_call_us(lambda: F.scaled_dot_product_attention(q, k, v)):.1f}"
          f", sagegen.sageattn {per_call_us(lambda: sagegen.sageattn(q, k, v)):.1f}"
          f", Attention(out=, workspace=) {per_call_us(lambda: attention(q, k, v, out=out, workspace=workspace)):.1f}")


def main(argv):
    if not torch.cuda.is_available():
        print("test_frontdoors_gpu.py: SKIPPED, no CUDA device")
        print("0 passed, 0 failed, 1 skipped")
        return 0
    return run_tests(globals(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
