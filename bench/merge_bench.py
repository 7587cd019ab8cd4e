"""The LSE merge of ring attention (issue 30): the library's fused kernel against the torch merge, one GPU, at the
ring's shapes: an f32 accumulator [b, h, n, d] (HND) or [b, n, h, d] (NHD) merged in place with one step's bf16 O
(`merge_attention_into`), the first merge (step 0's and step 1's bf16 O into a new f32 accumulator) and the last
(the accumulator and a bf16 O straight into a bf16 output), each on every row and on the second half of the rows
(the causal ring's steps from a higher rank), as the ring runs each now and as it ran them before (torch: a copy of
step 0's O into the accumulator, merge_attention_into's torch path, a final conversion of the accumulator). Median
microseconds of CUDA-event-timed calls, allocations included as the ring makes them.

    PYTHONPATH=python python3 bench/merge_bench.py [--heads 16 32] [--tokens 32768 65536] [--dim 128] [--json OUT]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import time_ms  # noqa: E402

import sagegen  # noqa: E402
from sagegen import _lse  # noqa: E402


def torch_path(function):
    """`function` run with the library's merge switched off (sagegen._lse falls back to torch)."""
    def run():
        saved = list(_lse._merge_function)
        _lse._merge_function[:] = [None]
        try:
            function()
        finally:
            _lse._merge_function[:] = saved
    return run


def case_tensors(layout, heads, tokens, dim, generator):
    shape = (1, heads, tokens, dim) if layout == "HND" else (1, tokens, heads, dim)
    o0 = torch.randn(shape, device="cuda", generator=generator, dtype=torch.bfloat16)
    o1 = torch.randn(shape, device="cuda", generator=generator, dtype=torch.bfloat16)
    lse0 = torch.randn((1, heads, tokens), device="cuda", generator=generator)
    lse1 = torch.randn((1, heads, tokens), device="cuda", generator=generator)
    return o0, o1, lse0, lse1


def measure(layout, heads, tokens, dim, half, generator):
    """The three merges of the ring, each as the ring runs it now (fused) and as it ran before (torch): the first
    merge copied step 0's O into a new f32 accumulator, every merge ran merge_attention_into's torch path, and the
    output was the accumulator converted (`.to`) at the end."""
    o0, o1, lse0, lse1 = case_tensors(layout, heads, tokens, dim, generator)
    acc, acc_lse = o0.float(), lse0.clone()
    out = torch.empty_like(o0)
    seq = 2 if layout == "HND" else 1
    rows = slice(tokens // 2, tokens) if half else slice(0, tokens)
    others = [part for part in (slice(0, rows.start),) if part.stop > part.start]  # rows the step does not see
    at = lambda t, part=rows: t[(slice(None),) * seq + (part,)]  # noqa: E731
    lse_rows = lambda t: t[..., rows]  # noqa: E731
    part_o, part_lse = at(o1).contiguous(), lse_rows(lse1).contiguous()  # a step's O covers only its rows

    def fused_first():
        target = torch.empty(o0.shape, dtype=torch.float32, device="cuda")
        for part in others:
            at(target, part).copy_(at(o0, part))
        _lse.merge_pair(at(o0), lse_rows(acc_lse), part_o, part_lse, at(target), lse_rows(acc_lse), layout)

    def torch_first():
        target = torch.empty(o0.shape, dtype=torch.float32, device="cuda").copy_(o0)
        sagegen.merge_attention_into(at(target), lse_rows(acc_lse), part_o, part_lse, layout)

    def fused_last():
        target = torch.empty_like(o0)
        for part in others:
            at(target, part).copy_(at(acc, part))
        _lse.merge_pair(at(acc), lse_rows(acc_lse), part_o, part_lse, at(target), lse_rows(acc_lse), layout)

    def torch_last():
        sagegen.merge_attention_into(at(acc), lse_rows(acc_lse), part_o, part_lse, layout)
        out.copy_(acc)

    def running():
        sagegen.merge_attention_into(at(acc), lse_rows(acc_lse), part_o, part_lse, layout)

    # (as the ring runs it now, as it ran before)
    forms = {"first (bf16 + bf16 -> f32)": (fused_first, torch_first),
             "running (f32 acc += bf16)": (running, running),
             "last (f32 + bf16 -> bf16)": (fused_last, torch_last)}
    results = []
    for form, (fused, baseline) in forms.items():
        fused_us = 1000 * time_ms(fused, warmup=3, repeats=21)
        torch_us = 1000 * time_ms(torch_path(baseline), warmup=3, repeats=21)
        results.append({"layout": layout, "heads": heads, "tokens": tokens, "dim": dim, "rows": "half" if half else
                        "all", "form": form, "fused_us": fused_us, "torch_us": torch_us,
                        "speedup": torch_us / fused_us})
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--tokens", type=int, nargs="+", default=[32768, 65536])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--json", help="write the rows as JSON lines to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("merge_bench.py: no CUDA device")
        return 1
    if _lse._merge_entry() is None:
        print("merge_bench.py: libsagegen_c.so without sage_merge_attention (build the library)")
        return 1
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}, d {args.dim}, batch 1, O bf16, accumulator f32")
    print(f"{'layout':<6} {'h':>3} {'n':>6} {'rows':>4} {'form':<28} {'fused us':>9} {'torch us':>9} {'x':>6}")
    for layout in ("HND", "NHD"):
        for heads in args.heads:
            for tokens in args.tokens:
                for half in (False, True):
                    for row in measure(layout, heads, tokens, args.dim, half, generator):
                        rows.append(row)
                        print(f"{layout:<6} {heads:>3} {tokens:>6} {row['rows']:>4} {row['form']:<28} "
                              f"{row['fused_us']:>9.1f} {row['torch_us']:>9.1f} {row['speedup']:>6.2f}")
    if args.json:
        with open(args.json, "w") as stream:
            for row in rows:
                stream.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
