"""Training speed of SageBwd (issue 12) against PyTorch SDPA (flash and cuDNN backends), measured in one run.

Each implementation runs forward + backward through autograd (`torch.autograd.grad` of the output against q, k, v
with a fixed dO), bf16, HND, 16k tokens per call (batch = 16384 / N, at least 1), hidden 2048 (heads = 2048 / d), as
bench/attention_bench.py does. TOPS counts 3.5x the forward's 4 * b * h * N^2 * d (halved when causal): the issue's
convention (the backward's five products are 2.5x). The forward alone is timed too, and the backward's share is
forward + backward minus forward. SageBwd's time includes everything the op does (quantization, LSE, D, dQ
conversion). Each number is the median over --rounds rounds of the median of 10 calls; --json writes the rows.
--impls (default flash,cudnn,sagebwd) may add sagebwd-rot-qks (`sagebwd_attention(rotate=True)`: forward sage-b-rot,
backward sagebwd-rot-qks: P and dS scaled per key for dV and dK, dS per query for dQ, issue 25), sagebwd-rot-ks (the
same forward, backward sagebwd-rot-ks: per key only) and sagebwd-rot (backward sagebwd-rot: one scale per tile), so
that the rotated pairings are timed in one run: each SageBwd column gets its x flash / x cudnn ratios and its forward
and backward ms.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from cuda_timing import time_ms  # noqa: E402
from sagebwd_presets import with_backward_preset  # noqa: E402


def forward_flops(batch, heads, tokens, dim, causal):
    return 4.0 * batch * heads * tokens * tokens * dim / (2.0 if causal else 1.0)


def implementations(causal):
    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    return {
        "flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sagebwd": lambda q, k, v: sagegen.sagebwd_attention(q, k, v, is_causal=causal),
        "sagebwd-rot": lambda q, k, v: with_backward_preset(q, k, v, causal, "sage-b-rot", "sagebwd-rot"),
        "sagebwd-rot-ks": lambda q, k, v: with_backward_preset(q, k, v, causal, "sage-b-rot", "sagebwd-rot-ks"),
        "sagebwd-rot-qks": lambda q, k, v: sagegen.sagebwd_attention(q, k, v, is_causal=causal, rotate=True),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", default="128")
    parser.add_argument("--tokens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--impls", default="flash,cudnn,sagebwd",
                        help="some of flash, cudnn, sagebwd, sagebwd-rot, sagebwd-rot-ks, sagebwd-rot-qks")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.manual_seed(0)
    names = args.impls.split(",")
    for name in names:
        if name not in implementations(False):
            raise SystemExit(f"--impls: unknown '{name}'; expected some of {', '.join(implementations(False))}")
    baselines = [n for n in ("flash", "cudnn") if n in names]
    sages = [n for n in names if n.startswith("sagebwd")]
    print("forward + backward TOPS (3.5x the forward's flops; bf16, 16k tokens x hidden 2048 per call, "
          + torch.cuda.get_device_name() + ")")
    width = {n: max(8, len(n)) for n in names}
    print(f"{'d':>4} {'causal':>6} {'N':>6} " + " ".join(f"{n:>{width[n]}}" for n in names)
          + "".join(f" {n + ' x ' + b:>22}" for n in sages for b in baselines)
          + "".join(f" {n + ' fwd/bwd ms':>26}" for n in sages)
          + (f" {'cudnn bwd ms':>12}" if "cudnn" in names else ""))
    rows = []
    for dim in map(int, args.dims.split(",")):
        for causal in map(int, args.causal.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                batch, heads = max(1, 16384 // tokens), 2048 // dim
                q, k, v = (torch.randn(batch, heads, tokens, dim, dtype=torch.bfloat16, device="cuda",
                                       requires_grad=True) for _ in range(3))
                d_o = torch.randn(batch, heads, tokens, dim, dtype=torch.bfloat16, device="cuda")
                timed = {}
                for name, attention in ((n, implementations(bool(causal))[n]) for n in names):
                    def step(attention=attention):
                        out = attention(q, k, v)
                        return torch.autograd.grad(out, (q, k, v), d_o)

                    def forward(attention=attention):
                        with torch.no_grad():
                            return attention(q, k, v)

                    timed[(name, "step")] = step
                    timed[(name, "forward")] = forward
                samples = {key: [] for key in timed}
                for _ in range(max(1, args.rounds)):
                    for key, function in timed.items():
                        samples[key].append(time_ms(function, warmup=2, repeats=10))
                ms = {key: statistics.median(values) for key, values in samples.items()}
                flops = 3.5 * forward_flops(batch, heads, tokens, dim, causal)
                row = {"d": dim, "causal": bool(causal), "N": tokens, "batch": batch, "heads": heads}
                for name in names:
                    row[name] = {"tops": flops / (ms[(name, "step")] * 1e-3) / 1e12, "step_ms": ms[(name, "step")],
                                 "forward_ms": ms[(name, "forward")],
                                 "backward_ms": ms[(name, "step")] - ms[(name, "forward")]}
                line = f"{dim:>4} {causal:>6} {tokens:>6} "
                line += " ".join(f"{row[n]['tops']:>{width[n]}.1f}" for n in names)
                line += "".join(f" {row[n]['tops'] / row[b]['tops']:>22.2f}" for n in sages for b in baselines)
                line += "".join(f" {row[n]['forward_ms']:>12.3f} / {row[n]['backward_ms']:>11.3f}" for n in sages)
                if "cudnn" in names:
                    line += f" {row['cudnn']['backward_ms']:>12.3f}"
                print(line, flush=True)
                rows.append(row)
                del q, k, v, d_o
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
