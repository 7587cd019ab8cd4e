"""Packed (variable-length) attention, timed (issue 28): sagegen.sageattn_varlen against the same tokens padded into a
dense batch (sagegen.sageattn on [batch, max_len]), a per-sequence PyTorch SDPA loop, SDPA over the packed tokens with
a block-diagonal mask, and flash_attn_varlen_func where flash-attn is installed. Equal total tokens per row of the
table; lengths drawn uniformly in [max_len / 8, max_len] (seeded). The last two columns run the same total tokens as
sequences of length max_len, packed and as the dense call of that shape. Not a test: numbers only.

    python3 bench/varlen_bench.py [--preset sage-b] [--heads 32] [--heads-kv 8] [--dim 128] [--causal]
                                  [--total 16384] [--max-len 512,2048,8192] [--json out.json]
"""

import argparse
import json
import math
import os
import random
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sagegen  # noqa: E402
from cuda_timing import time_ms  # noqa: E402


def lengths_for(total, max_len, seed):
    """Lengths in [max_len / 8, max_len] summing to `total` (the last one cut)."""
    rng, lengths = random.Random(seed), []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(max(1, max_len // 8), max_len), total - sum(lengths)))
    return lengths


def flops(lengths, heads, dim, causal):
    work = sum(n * n for n in lengths) * heads * dim * 4  # Q.K^T and P.V
    return work / 2 if causal else work


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="sage-b")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--total", type=int, default=16384)
    parser.add_argument("--max-len", default="512,2048,8192")
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        flash_attn_varlen_func = None
    rows = []
    print(f"{'max_len':>8} {'seqs':>5} {'varlen ms':>10} {'TFLOPS':>7} {'padded ms':>10} {'sdpa loop':>10} "
          f"{'sdpa mask':>10} {'flash-attn':>10} {'uniform varlen':>14} {'uniform dense':>13}")
    for max_len in (int(x) for x in args.max_len.split(",")):
        lengths = lengths_for(args.total, max_len, seed=max_len)
        batch, longest = len(lengths), max(lengths)
        cu = torch.tensor([0] + lengths, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)
        q = torch.randn(args.total, args.heads, args.dim, dtype=torch.float16, device="cuda")
        k, v = (torch.randn(args.total, args.heads_kv, args.dim, dtype=torch.float16, device="cuda") for _ in range(2))
        row = {"max_len": max_len, "sequences": batch, "total": args.total}
        row["varlen_ms"] = time_ms(lambda: sagegen.sageattn_varlen(q, k, v, cu, cu, longest, longest,
                                                                   is_causal=args.causal, preset=args.preset,
                                                                   check_offsets=False))
        padded = [torch.zeros(batch, longest, t.shape[1], args.dim, dtype=t.dtype, device="cuda") for t in (q, k, v)]
        row["padded_ms"] = time_ms(lambda: sagegen.sageattn(*padded, tensor_layout="NHD", is_causal=args.causal,
                                                            preset=args.preset, causal_alignment="bottom-right"))
        starts = [0] + list(torch.tensor(lengths).cumsum(0).tolist())
        groups = args.heads // args.heads_kv
        slices = [(q[a:b].transpose(0, 1)[None], k[a:b].transpose(0, 1).repeat_interleave(groups, 0)[None],
                   v[a:b].transpose(0, 1).repeat_interleave(groups, 0)[None]) for a, b in zip(starts, starts[1:])]
        row["sdpa_loop_ms"] = time_ms(lambda: [F.scaled_dot_product_attention(*s, is_causal=args.causal)
                                               for s in slices])
        if args.total <= 32768:  # the mask is total^2 bytes
            ids = torch.repeat_interleave(torch.arange(batch, device="cuda"), torch.tensor(lengths, device="cuda"))
            mask = ids[:, None] == ids[None, :]
            if args.causal:
                mask &= torch.ones_like(mask).tril()
            qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k.repeat_interleave(groups, 1),
                                                             v.repeat_interleave(groups, 1)))
            row["sdpa_mask_ms"] = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask))
        if flash_attn_varlen_func is not None:
            row["flash_attn_ms"] = time_ms(lambda: flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                                          causal=args.causal))
        row["varlen_tflops"] = flops(lengths, args.heads, args.dim, args.causal) / row["varlen_ms"] / 1e9
        # The same total tokens as sequences of one length (max_len): the packed call against the dense call of
        # that exact shape, which computes the same thing (the "within 10% of dense at equal tokens").
        uniform = args.total // max_len
        cu_uniform = torch.arange(0, (uniform + 1) * max_len, max_len, dtype=torch.int32, device="cuda")
        qu, ku, vu = (t[:uniform * max_len] for t in (q, k, v))
        row["uniform_varlen_ms"] = time_ms(lambda: sagegen.sageattn_varlen(
            qu, ku, vu, cu_uniform, cu_uniform, max_len, max_len, is_causal=args.causal, preset=args.preset,
            check_offsets=False))
        dense = [t.view(uniform, max_len, t.shape[1], args.dim) for t in (qu, ku, vu)]
        row["uniform_dense_ms"] = time_ms(lambda: sagegen.sageattn(*dense, tensor_layout="NHD", is_causal=args.causal,
                                                                   preset=args.preset,
                                                                   causal_alignment="bottom-right"))
        rows.append(row)

        def cell(name):
            return f"{row[name]:10.3f}" if name in row else f"{'-':>10}"
        print(f"{max_len:>8} {batch:>5} {row['varlen_ms']:10.3f} {row['varlen_tflops']:7.1f} {cell('padded_ms')} "
              f"{cell('sdpa_loop_ms')} {cell('sdpa_mask_ms')} {cell('flash_attn_ms')} {row['uniform_varlen_ms']:14.3f} "
              f"{row['uniform_dense_ms']:13.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": torch.cuda.get_device_name(), "preset": args.preset, "heads": args.heads,
                       "heads_kv": args.heads_kv, "dim": args.dim, "causal": args.causal, "rows": rows}, out,
                      indent=1)
    assert all(math.isfinite(r["varlen_ms"]) for r in rows)


if __name__ == "__main__":
    main()
