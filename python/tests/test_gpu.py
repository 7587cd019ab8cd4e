"""sagegen from PyTorch on a GPU: every bad input raises naming the argument (run this file under compute-sanitizer
memcheck too: a refused call must touch no memory), sageattn against PyTorch SDPA (batch > 1, GQA, NHD, bf16,
causal top-left with q shorter and longer than kv, bottom-right on request), block masks, per-device kernels,
torch.compile(fullgraph=True) and CUDA-graph capture, sdpa() routing and its fallbacks.

    python3 python/tests/test_gpu.py [-k NAME]     (tools/gpu-check --run does this; pytest runs it too)
"""

import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import raises, run_tests  # noqa: E402
import sagegen  # noqa: E402



def qkv(batch=2, heads_q=8, heads_kv=8, tokens_q=256, tokens_kv=256, dim=128, dtype=torch.float16, layout="HND"):
    def make(heads, tokens):
        shape = (batch, heads, tokens, dim) if layout == "HND" else (batch, tokens, heads, dim)
        return torch.randn(shape, dtype=dtype, device="cuda")
    return make(heads_q, tokens_q), make(heads_kv, tokens_kv), make(heads_kv, tokens_kv)


def reference(q, k, v, is_causal=False, layout="HND", bottom_right=False):
    """PyTorch SDPA in f32 (top-left causal), or an explicit bottom-right mask."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.float() for t in (q, k, v))
    if k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    mask = None
    if is_causal:
        n_q, n_kv = q.shape[2], k.shape[2]
        offset = n_kv - n_q if bottom_right else 0
        rows = torch.arange(n_q, device="cuda")[:, None]
        mask = torch.arange(n_kv, device="cuda")[None, :] <= rows + offset
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2) if layout == "NHD" else out


def assert_close(out, expected, min_cosine=0.995):
    out, expected = out.float().flatten(), expected.float().flatten()
    assert torch.isfinite(out).all()
    cosine = F.cosine_similarity(out, expected, dim=0).item()
    assert cosine >= min_cosine, f"cosine similarity {cosine:.5f} < {min_cosine}"


# ---- every bad input raises, naming the argument ----

def bad_calls():
    q, k, v = qkv(dim=128)
    q64, k64, v64 = qkv(dim=64)
    return [
        ("q", lambda: sagegen.Attention("sage-b", head_dim=128)(q64, k64, v64)),  # d=64 into a d=128 kernel
        ("q", lambda: sagegen.Attention("sage-b", head_dim=128, dtype="f16")(q.bfloat16(), k.bfloat16(),
                                                                              v.bfloat16())),
        ("k", lambda: sagegen.sageattn(q, k.bfloat16(), v)),
        ("v", lambda: sagegen.sageattn(q, k, v[:, :, :128])),
        ("k", lambda: sagegen.sageattn(q, k[:1], v[:1])),
        ("k", lambda: sagegen.sageattn(q, k[:, :3], v[:, :3])),  # 3 kv heads do not divide 8
        ("q", lambda: sagegen.sageattn(q.cpu(), k, v)),
        ("k", lambda: sagegen.sageattn(q, k.cpu(), v)),
        ("q", lambda: sagegen.sageattn(q.float(), k, v)),
        ("q", lambda: sagegen.sageattn(q[..., 1:65], k[..., :64], v[..., :64])),  # misaligned
        ("q", lambda: sagegen.sageattn(q[0], k, v)),
        ("tensor_layout", lambda: sagegen.sageattn(q, k, v, tensor_layout="BHSD")),
        ("sm_scale", lambda: sagegen.sageattn(q, k, v, sm_scale=-1.0)),
        ("smooth_k", lambda: sagegen.sageattn(q, k, v, smooth_k="yes")),
        ("lse", lambda: sagegen.Attention("sage-b", head_dim=128, lse=True)(
            q, k, v, lse=torch.empty(2, 8, 255, device="cuda"))),
        ("lse", lambda: sagegen.Attention("sage-b", head_dim=128, lse=True)(
            q, k, v, lse=torch.empty(2, 8, 256, device="cuda", dtype=torch.float16))),
        ("lse", lambda: sagegen.Attention("sage-b", head_dim=128)(q, k, v, lse=torch.empty(2, 8, 256, device="cuda"))),
        ("o", lambda: sagegen.Attention("sage-b", head_dim=128)(q, k, v, out=torch.empty_like(q)[:, :, :100])),
        ("o", lambda: sagegen.Attention("sage-b", head_dim=128)(q, k, v, out=q)),
        ("block_mask", lambda: sagegen.Attention("sage-b", head_dim=128)(
            q, k, v, block_mask=torch.ones(2, 8, 2, 4, dtype=torch.uint8, device="cuda"))),
        ("workspace", lambda: sagegen.Attention("sage-b", head_dim=128)(
            q, k, v, workspace=torch.empty(16, dtype=torch.uint8, device="cuda"))),
        ("device", lambda: sagegen.Attention("sage-b", head_dim=128)._runner(torch.cuda.device_count(), 1)),
        ("causal_alignment", lambda: sagegen.sageattn(q, k, v, is_causal=True, causal_alignment="middle")),
    ]


def test_bad_input_raises_naming_the_argument():
    for argument, call in bad_calls():
        with raises(sagegen.SageArgumentError) as caught:
            call()
        message = str(caught.value)
        assert message.startswith(argument + ":"), f"expected an error naming {argument}, got {message!r}"
        print(f"    refused, naming {argument}: {message}")
    torch.cuda.synchronize()  # nothing was launched that could fail later


# ---- numerics against PyTorch SDPA ----

def test_sageattn_matches_sdpa():
    torch.manual_seed(0)
    for tokens_q, tokens_kv in [(256, 256), (128, 384), (384, 128), (200, 333)]:
        for is_causal in (False, True):
            q, k, v = qkv(batch=2, tokens_q=tokens_q, tokens_kv=tokens_kv)
            out = sagegen.sageattn(q, k, v, is_causal=is_causal)
            assert_close(out, reference(q, k, v, is_causal))


def test_bottom_right_alignment_on_request():
    q, k, v = qkv(batch=1, tokens_q=128, tokens_kv=384)
    out = sagegen.sageattn(q, k, v, is_causal=True, causal_alignment="bottom-right")
    assert_close(out, reference(q, k, v, True, bottom_right=True))
    top_left = sagegen.sageattn(q, k, v, is_causal=True)
    assert (out - top_left).abs().max() > 0.1  # the two rules really differ here


def test_gqa_layouts_dtypes_head_dims():
    for dtype in (torch.float16, torch.bfloat16):
        for layout in ("HND", "NHD"):
            for dim in (64, 128):
                q, k, v = qkv(batch=3, heads_q=8, heads_kv=2, tokens_q=300, tokens_kv=500, dim=dim, dtype=dtype,
                              layout=layout)
                out = sagegen.sageattn(q, k, v, tensor_layout=layout)
                assert out.dtype == dtype
                assert_close(out, reference(q, k, v, layout=layout))


def test_head_dims_beyond_64_and_128():
    # Issue 28: d 32..256 in steps of 16 run (the sm80 schedule where the sm90 one has no tiles), with K offsets
    for index, dim in enumerate((32, 80, 96, 160, 192, 256)):
        dtype = torch.bfloat16 if index % 2 else torch.float16
        is_causal = index % 3 == 0
        q, k, v = qkv(batch=2, heads_q=4, heads_kv=2, tokens_q=300, tokens_kv=333, dim=dim, dtype=dtype)
        k = k + 8 * torch.randn(1, 1, 1, dim, device=k.device, dtype=dtype)  # per-channel offsets: K smoothing's case
        out, lse = sagegen.sageattn(q, k, v, is_causal=is_causal, return_lse=True)
        assert out.shape == q.shape and lse.shape == q.shape[:3]
        assert_close(out, reference(q, k, v, is_causal))


def test_padded_head_dims():
    # Head dims without a kernel (72, 40) and, on Hopper with long keys, 80 / 112 between the wgmma kernels' 64 and
    # 128 run zero-padded (python/sagegen/_head_dim.py): exact, so they match the reference like any other call, LSE,
    # sm_scale, NHD, bf16, GQA, causal and K offsets included; O comes back contiguous with the caller's head dim.
    cases = [(72, "sage-b", 300, 333), (40, "sage2-fp8", 300, 333), (80, "sage-b", 512, 4096),
             (112, "sage2-fp8", 512, 4096), (48, "sage-b", 256, 4096)]
    for index, (dim, preset, tokens_q, tokens_kv) in enumerate(cases):
        dtype = torch.bfloat16 if index % 2 else torch.float16
        layout = "NHD" if index % 3 == 1 else "HND"
        is_causal = index % 2 == 0
        q, k, v = qkv(batch=2, heads_q=4, heads_kv=2, tokens_q=tokens_q, tokens_kv=tokens_kv, dim=dim, dtype=dtype,
                      layout=layout)
        k = k + 8 * torch.randn(dim, device=k.device, dtype=dtype)  # per-channel offsets: K smoothing's case
        scale = 0.7 * dim ** -0.5 if index == 3 else None
        out, lse = sagegen.sageattn(q, k, v, tensor_layout=layout, is_causal=is_causal, sm_scale=scale,
                                    return_lse=True, preset=preset)
        assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous(), (dim, out.shape, out.stride())
        if scale is None:
            expected = reference(q, k, v, is_causal, layout=layout)
        else:
            expected = reference(q * (scale * dim ** 0.5), k, v, is_causal, layout=layout)
        assert_close(out, expected)
        qh, kh = (t.transpose(1, 2) if layout == "NHD" else t for t in (q, k))
        kh = kh.float().repeat_interleave(2, dim=1)
        logits = (qh.float() @ kh.transpose(-1, -2)) * (scale or dim ** -0.5)
        if is_causal:
            logits = logits.masked_fill(torch.ones_like(logits, dtype=torch.bool).triu(1), float("-inf"))
        error = (lse - torch.logsumexp(logits, -1)).abs().max().item()
        assert error < 0.05, (dim, preset, error)


def test_sm_scale_and_lse():
    q, k, v = qkv(batch=2, tokens_q=256, tokens_kv=256)
    scale = 0.05
    out, lse = sagegen.sageattn(q, k, v, sm_scale=scale, return_lse=True)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    assert_close(out, torch.softmax(scores, -1) @ v.float())
    assert lse.shape == (2, 8, 256) and lse.dtype == torch.float32
    assert (lse - torch.logsumexp(scores, -1)).abs().max().item() < 0.05


BLOCK_SPARSE_IR = """sage.attention @"sage-b-sparse" version(1) head_dim(128) block_q(128) block_kv(64) {
  %q = sage.input q
  %k = sage.input k
  %v = sage.input v
  %k_smoothed = sage.smooth %k over sequence
  %q_int8 = sage.quantize %q to int8 per_block {fold_softmax_scale, group_tokens = 128 : i64}
  %k_int8 = sage.quantize %k_smoothed to int8 per_block {group_tokens = 64 : i64}
  %s = sage.mma %q_int8, %k_int8 -> s32
  %s_dequant = sage.dequant %s
  %s_masked = sage.mask %s_dequant block_sparse
  %p = sage.online_softmax %s_masked exp2 state f32
  %p_f16 = sage.quantize %p to f16 none
  %v_f16 = sage.quantize %v to f16 none
  %pv = sage.mma %p_f16, %v_f16 -> f16
  %o_accumulated = sage.accumulate %pv as f16
  %o = sage.normalize %o_accumulated by %p
  sage.write_o %o
}
"""


def test_block_mask_skips_blocks():
    torch.manual_seed(0)
    attention = sagegen.Attention(ir=BLOCK_SPARSE_IR, head_dim=128)
    block_q, block_kv = attention.block_sizes()
    q, k, v = qkv(batch=2, heads_q=2, heads_kv=2, tokens_q=256, tokens_kv=320)
    q_blocks, kv_blocks = -(-256 // block_q), -(-320 // block_kv)
    mask = (torch.rand(2, 2, q_blocks, kv_blocks, device="cuda") < 0.5).to(torch.uint8)
    mask[..., 0] = 1  # every row keeps a block
    out = attention(q, k, v, block_mask=mask)
    dense = mask.repeat_interleave(block_q, 2).repeat_interleave(block_kv, 3)[:, :, :256, :320].bool()
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=dense)
    assert_close(out, expected)
    assert_close(attention(q, k, v, block_mask=torch.ones_like(mask)), reference(q, k, v))
    with raises(sagegen.SageArgumentError, match="^block_mask:"):
        attention(q, k, v, block_mask=mask[:, :, :, :-1].contiguous())


def test_each_device_gets_its_own_kernels():
    attention = sagegen.Attention("sage-b", head_dim=64)
    q, k, v = qkv(dim=64)
    attention(q, k, v)
    assert set(attention._runners) == {(q.device.index or 0, 1)}
    # bf16 tensors get bf16 kernels (never read as f16)
    out = attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert out.dtype == torch.bfloat16 and len(attention._runners) == 2
    # a call while another device is current still runs on q's device (the guard), and streams each get a workspace
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        attention(q, k, v)
    torch.cuda.synchronize()
    assert len(attention._workspaces) == 2


# ---- torch.compile and CUDA graphs ----

class SmallAttention(torch.nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim * heads, 3 * dim * heads, dtype=torch.float16)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        return sagegen.sageattn(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, -1)


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    module = SmallAttention().cuda()
    x = torch.randn(2, 256, 256, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        eager = module(x)
        compiled = torch.compile(module, fullgraph=True)(x)
    # Inductor's projections may round differently from eager's, and int8 quantization can amplify that slightly.
    assert_close(compiled, eager, min_cosine=0.9999)


def test_cuda_graph_replays():
    torch.manual_seed(0)
    module = SmallAttention().cuda()
    x = torch.randn(2, 256, 256, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                module(x)  # warm-up: kernels built, allocator warm
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = module(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert (captured.float() - module(x).float()).abs().max().item() < 1e-2


# ---- sdpa() routing ----

def test_sdpa_routes_and_falls_back_once():
    q, k, v = qkv(batch=2, tokens_q=128, tokens_kv=256)
    expected = reference(q, k, v, True)  # outside: the reference itself calls SDPA with an attn_mask
    with sagegen.sdpa():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert_close(out, expected)
        mask = torch.ones(128, 256, dtype=torch.bool, device="cuda")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        messages = [str(w.message) for w in caught if "sagegen.sdpa" in str(w.message)]
        assert len(messages) == 2 and "attn_mask" in messages[0] and "dropout" in messages[1]
    assert F.scaled_dot_product_attention.__module__.startswith("torch")


# ---- SageBwd (issue 12): trainable INT8 attention through autograd ----

def _cosine(a, b):
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    return float((a @ b) / (a.norm() * b.norm()))


def _sdpa_gradients(q, k, v, grad, causal):
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal, enable_gqa=k.shape[1] != q.shape[1])
    return (out, *torch.autograd.grad(out, (q32, k32, v32), grad.float()))


def test_sagebwd_gradients_match_sdpa_autograd():
    torch.manual_seed(0)
    for dtype, causal, heads_kv, d in ((torch.float16, False, 8, 128), (torch.bfloat16, True, 2, 64),
                                       (torch.bfloat16, False, 8, 128), (torch.float16, True, 4, 128)):
        q = torch.randn(2, 8, 1000, d, dtype=dtype, device="cuda", requires_grad=True)
        k, v = (torch.randn(2, heads_kv, 1000, d, dtype=dtype, device="cuda", requires_grad=True) for _ in range(2))
        grad = torch.randn(2, 8, 1000, d, dtype=dtype, device="cuda")
        out = sagegen.sagebwd_attention(q, k, v, is_causal=causal)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        expected, eq, ek, ev = _sdpa_gradients(q, k, v, grad, causal)
        cosines = [_cosine(a, b) for a, b in ((out, expected), (dq, eq), (dk, ek), (dv, ev))]
        print(f"  sagebwd {dtype} causal={causal} heads 8/{heads_kv} d={d}: cos o {cosines[0]:.6f} dq {cosines[1]:.6f} "
              f"dk {cosines[2]:.6f} dv {cosines[3]:.6f}")
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
        assert cosines[0] >= 0.999 and cosines[3] >= 0.995 and cosines[1] >= 0.99 and cosines[2] >= 0.99, cosines


def test_sagebwd_function_compile_and_scale():
    from sagegen._backward import SageBwdFunction
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 256, 64, dtype=torch.float16, device="cuda", requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 4, 256, 64, dtype=torch.float16, device="cuda")
    scale = 0.2
    out = sagegen.sagebwd_attention(q, k, v, is_causal=True, scale=scale)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    out_function, _ = SageBwdFunction.apply(q, k, v, True, scale, "sage-b")
    grads_function = torch.autograd.grad(out_function, (q, k, v), grad)
    for a, b in zip(grads, grads_function):
        assert _cosine(a, b) >= 0.9999
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    reference = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True, scale=scale)
    expected = torch.autograd.grad(reference, (q32, k32, v32), grad.float())
    assert min(_cosine(a, b) for a, b in zip(grads, expected)) >= 0.99
    compiled = torch.compile(lambda q, k, v: sagegen.sagebwd_attention(q, k, v, is_causal=True, scale=scale),
                             fullgraph=True)
    grads_compiled = torch.autograd.grad(compiled(q, k, v), (q, k, v), grad)
    for a, b in zip(grads, grads_compiled):
        assert _cosine(a, b) >= 0.9999


def test_eager_routes_skip_the_dispatcher_and_match_the_ops():
    """The eager fast routes (the ops' bodies without PyTorch's dispatcher) compute exactly what the ops do, and
    are taken only where they may be: a gradient-wanting sageattn call still goes through its op."""
    from sagegen import _torch as routes
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 4, 300, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3))
    grad = torch.randn(1, 4, 300, 128, dtype=torch.bfloat16, device="cuda")
    assert routes.dispatcher_free(q, k, v)
    out = sagegen.sagebwd_attention(q, k, v, is_causal=True)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    out_op, _ = torch.ops.sagegen.sagebwd_attention(q, k, v, True, 1 / math.sqrt(128), "sage-b")
    grads_op = torch.autograd.grad(out_op, (q, k, v), grad)
    assert torch.equal(out, out_op)
    for a, b in zip(grads, grads_op):
        assert torch.equal(a, b)
    with torch.no_grad():
        fast = sagegen.sageattn(q, k, v, is_causal=True, return_lse=True)
        through_op = torch.ops.sagegen.attention(q, k, v, None, "sage-b", True, True, "HND", True, "")
    assert torch.equal(fast[0], through_op[0]) and torch.equal(fast[1], through_op[1])
    # Gradients wanted from sageattn (no autograd): through its op, whose output refuses backward, instead of a
    # silently detached output from the body.
    through_op = sagegen.sageattn(q, k, v)
    assert through_op.requires_grad
    with raises(RuntimeError):
        through_op.sum().backward()
    assert not routes.dispatcher_free(q.detach().to("meta")) and not routes.dispatcher_free(q.detach().cpu())
    meta = sagegen.sagebwd_attention(*(t.detach().to("meta") for t in (q, k, v)))  # shapes only, via the fake
    assert meta.shape == q.shape and meta.device.type == "meta"


def main(argv):
    if not torch.cuda.is_available():
        print("test_gpu.py: SKIPPED, no CUDA device")
        return 0
    return run_tests(globals(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
