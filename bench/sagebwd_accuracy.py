"""Gradient accuracy of SageBwd (issue 25) beside PyTorch SDPA's cuDNN backend, on the data SageAttention was made for.

For each data class, dtype and causality: q, k, v are drawn in f32, rounded to the dtype, and every implementation's
dQ, dK, dV (for one fixed dO) are compared with f32 autograd of exact attention on the same rounded inputs: cosine
similarity and relative L1 (sum |x - ref| / sum |ref|). Implementations (--impls): cudnn, sagebwd (forward sage-b),
sagebwd-rot (forward sage-b-rot, backward sagebwd-rot: Q and K rotated in both passes), sagebwd-rot-ks (the same
with the backward preset sagebwd-rot-ks: P and dS scaled per key for dV and dK, issue 25) and sagebwd-rot-qks
(`sagebwd_attention(rotate=True)`: backward sagebwd-rot-qks, dS for dQ scaled per query too). Classes:
  normal      N(0, 1)
  k_bias      K plus a per-channel mean with std --bias (8 by default): the channel offsets of real models' keys
  k_bias_qout the same, plus --outliers Q channels scaled by 20 (Q outlier channels)
The defaults follow the issue's table: N = 2048, 4 heads, d = 128, batch 1. --json writes the rows.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from sagebwd_presets import with_backward_preset  # noqa: E402

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}


def make_inputs(kind, shape, dtype, bias, outliers, generator):
    b, h, n, d = shape
    randn = lambda *size: torch.randn(*size, generator=generator, device="cuda", dtype=torch.float32)  # noqa: E731
    q, k, v, d_o = randn(b, h, n, d), randn(b, h, n, d), randn(b, h, n, d), randn(b, h, n, d)
    if kind in ("k_bias", "k_bias_qout"):
        k = k + bias * randn(b, h, 1, d)
    if kind == "k_bias_qout":
        channels = torch.randperm(d, generator=generator, device="cuda")[:outliers]
        q[..., channels] *= 20.0
    return [t.to(dtype) for t in (q, k, v, d_o)]


def gradients(run, q, k, v, d_o):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = run(q, k, v)
    return torch.autograd.grad(out, (q, k, v), d_o.to(out.dtype))


def metrics(value, reference):
    value, reference = value.double().flatten(), reference.double().flatten()
    cos = F.cosine_similarity(value, reference, dim=0).item()
    rel_l1 = ((value - reference).abs().sum() / reference.abs().sum()).item()
    return cos, rel_l1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--classes", default="normal,k_bias,k_bias_qout")
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--bias", type=float, default=8.0, help="std of K's per-channel mean")
    parser.add_argument("--outliers", type=int, default=4, help="Q outlier channels (x20)")
    parser.add_argument("--impls", default="cudnn,sagebwd,sagebwd-rot,sagebwd-rot-ks,sagebwd-rot-qks")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()

    shape = (1, args.heads, args.tokens, args.dim)
    rows = []
    print(f"# {torch.cuda.get_device_name()}  N={args.tokens} h={args.heads} d={args.dim}; "
          "reference: f32 autograd on the same rounded inputs; cos / rel-L1")
    print(f"{'class':<12} {'dtype':<5} {'causal':<6} {'impl':<14} {'dQ':>18} {'dK':>18} {'dV':>18}")
    for kind in args.classes.split(","):
        for dtype_name in args.dtypes.split(","):
            for causal in (bool(int(c)) for c in args.causal.split(",")):
                generator = torch.Generator(device="cuda").manual_seed(0)
                q, k, v, d_o = make_inputs(kind, shape, DTYPES[dtype_name], args.bias, args.outliers, generator)

                def exact(q_, k_, v_):
                    return F.scaled_dot_product_attention(q_.float(), k_.float(), v_.float(), is_causal=causal)

                def cudnn(q_, k_, v_):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q_, k_, v_, is_causal=causal)

                def sagebwd(q_, k_, v_):
                    return sagegen.sagebwd_attention(q_, k_, v_, is_causal=causal)

                def sagebwd_rot(q_, k_, v_):
                    return with_backward_preset(q_, k_, v_, causal, "sage-b-rot", "sagebwd-rot")

                def sagebwd_rot_ks(q_, k_, v_):  # P and dS per key for dV and dK, dS per tile for dQ
                    return with_backward_preset(q_, k_, v_, causal, "sage-b-rot", "sagebwd-rot-ks")

                def sagebwd_rot_qks(q_, k_, v_):  # sagebwd_attention(rotate=True)'s pairing: dS for dQ per query too
                    return sagegen.sagebwd_attention(q_, k_, v_, is_causal=causal, rotate=True)

                impls = {"cudnn": cudnn, "sagebwd": sagebwd, "sagebwd-rot": sagebwd_rot,
                         "sagebwd-rot-ks": sagebwd_rot_ks, "sagebwd-rot-qks": sagebwd_rot_qks}

                with sdpa_kernel(SDPBackend.MATH):
                    reference = gradients(exact, q, k, v, d_o)
                for name in args.impls.split(","):
                    if name not in impls:
                        raise SystemExit(f"--impls: unknown '{name}'; expected some of {', '.join(impls)}")
                    run = impls[name]
                    grads = gradients(run, q, k, v, d_o)
                    row = {"class": kind, "dtype": dtype_name, "causal": causal, "impl": name}
                    cells = []
                    for label, value, ref in zip(("dq", "dk", "dv"), grads, reference):
                        cos, rel = metrics(value, ref)
                        row[f"{label}_cos"], row[f"{label}_rel_l1"] = cos, rel
                        cells.append(f"{cos:.5f} / {rel:.4f}")
                    rows.append(row)
                    print(f"{kind:<12} {dtype_name:<5} {int(causal):<6} {name:<14} " +
                          " ".join(f"{c:>18}" for c in cells), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "shape": shape, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
