"""Accuracy of the forward presets (and SageAttention2's sm90 FP8 kernel) on the input classes users have.

Each class draws Q, K, V (b, h, N, d) in f16 or bf16; the reference is exact attention in float64 on the GPU over the
same rounded inputs. Prints cos similarity, relative L1 and RMSE per (class, implementation); --json writes them.

Classes: N(0,1); K with a per-channel mean (std 8, SageAttention's C1); K and V with per-channel means; Q with outlier
channels (x 20 on 4 channels) plus K's mean; an attention sink (token 0's key aligned with every query); sharp logits
(Q and K x 3); and the same in bf16.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from attention_bench import load_sageattention  # noqa: E402


def make_inputs(kind, shape, dtype, generator):
    b, h, n, d = shape
    randn = lambda *size: torch.randn(*size, generator=generator, device="cuda", dtype=torch.float32)  # noqa: E731
    q, k, v = randn(b, h, n, d), randn(b, h, n, d), randn(b, h, n, d)
    if kind in ("k_mean", "kv_mean", "q_outliers"):
        k = k + 8.0 * randn(b, h, 1, d)
    if kind == "kv_mean":
        v = v + 8.0 * randn(b, h, 1, d)
    if kind == "q_outliers":
        channels = torch.randperm(d, generator=generator, device="cuda")[:4]
        q[..., channels] *= 20.0
    if kind == "sink":
        k[:, :, 0, :] = q.mean(dim=2) * 4.0  # every query's largest logit is at token 0
    if kind == "sharp":
        q, k = 3.0 * q, 3.0 * k
    return q.to(dtype), k.to(dtype), v.to(dtype)


def metrics(out, reference):
    out, reference = out.double().flatten(), reference.flatten()
    cos = torch.nn.functional.cosine_similarity(out, reference, dim=0).item()
    rel_l1 = ((out - reference).abs().sum() / reference.abs().sum()).item()
    rmse = (out - reference).square().mean().sqrt().item()
    return {"cos": cos, "rel_l1": rel_l1, "rmse": rmse}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--shape", default="1,8,4096,128", help="b,h,N,d")
    parser.add_argument("--classes", default="normal,k_mean,kv_mean,q_outliers,sink,sharp")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--sageattn", help="SageAttention2's built source directory")
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = tuple(map(int, args.shape.split(",")))
    sageattention = load_sageattention(args.sageattn) if args.sageattn else None
    rows = []
    print(f"accuracy against float64 attention, shape (b, h, N, d) = {shape}, causal={args.causal}, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'class':>12} {'dtype':>5} {'implementation':>16} {'cos':>10} {'rel_l1':>8} {'rmse':>9}")
    for dtype in (torch.float16, torch.bfloat16):
        for kind in args.classes.split(","):
            generator = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = make_inputs(kind, shape, dtype, generator)
            reference = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                                         is_causal=args.causal)
            outputs = {}
            for preset in args.presets.split(","):
                outputs[preset] = sagegen.Attention(preset, head_dim=shape[3], causal=args.causal)(q, k, v)
            if sageattention:
                outputs["sageattn"] = sageattention["module"].sageattn_qk_int8_pv_fp8_cuda_sm90(
                    q, k, v, tensor_layout="HND", is_causal=args.causal, qk_quant_gran="per_warp",
                    pv_accum_dtype="fp32+fp32")
            for name, out in outputs.items():
                row = {"class": kind, "dtype": str(dtype).replace("torch.", ""), "implementation": name,
                       **metrics(out, reference)}
                rows.append(row)
                print(f"{kind:>12} {row['dtype'][:5]:>5} {name:>16} {row['cos']:>10.6f} {row['rel_l1']:>8.4f} "
                      f"{row['rmse']:>9.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
