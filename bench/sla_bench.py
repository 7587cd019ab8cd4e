"""SLA (issue 13) against dense cuDNN SDPA, measured in one run: the sparsity curve of the forward and the backward,
and the mask prediction's cost alone.

Runs build-gpu/bench/sla_bench (the C++ timing program: whole SLA forward, mask prediction alone, sparse part alone;
one JSON line per sparsity), then times torch's cuDNN SDPA forward (dense, HND, in --dtype: f16 or bf16, as SLA's
q, k, v) at the same shape, and prints a
table: speedup = cuDNN ms / SLA forward ms. Sparsity s means k_h = 100 - s % of the kv blocks of each row are
computed exactly (k_l = min(10, s) % skipped, the rest through the linear branch). --plot writes the curve as a PNG
(matplotlib, if installed); --json writes the rows.

  python3 bench/sla_bench.py --binary build-gpu/bench/sla_bench --dim 128 --tokens 32768 --heads 16 [--dtype bf16]
"""

import argparse
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cuda_timing import time_ms  # bench/ is the script's directory


def dense_cudnn_ms(batch, heads, tokens, dim, repeats, dtype=torch.float16):
    """(forward ms, backward ms) of dense cuDNN SDPA; the backward is forward+backward minus the forward."""
    q, k, v = (torch.randn(batch, heads, tokens, dim, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, tokens, dim, device="cuda", dtype=dtype)

    def forward():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v)

    def forward_backward():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, k, v).backward(grad)

    forward_ms = time_ms(forward, repeats=repeats)
    return forward_ms, max(time_ms(forward_backward, repeats=repeats) - forward_ms, 1e-6)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--binary", default=os.path.join(here, "..", "build-gpu", "bench", "sla_bench"))
    parser.add_argument("--preset", default="sla-f16", help="sla-f16 or sla-int8 (the sparse part's quantizers)")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--sparsities", default="50,60,70,80,85,90,95,97")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--plot", help="write the sparsity-vs-speedup curve to this PNG")
    parser.add_argument("--dtype", choices=("f16", "bf16"), default="f16", help="of q, k, v (SLA's and cuDNN's)")
    args = parser.parse_args()

    command = [args.binary, "--preset", args.preset, "--dim", str(args.dim), "--tokens", str(args.tokens),
               "--batch", str(args.batch), "--heads", str(args.heads), "--sparsities", args.sparsities,
               "--repeats", str(args.repeats), "--input", args.dtype]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        sys.exit(f"sla_bench failed ({completed.returncode}): {completed.stderr.strip()}")
    rows = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    dense, dense_backward = dense_cudnn_ms(args.batch, args.heads, args.tokens, args.dim, args.repeats,
                                           torch.bfloat16 if args.dtype == "bf16" else torch.float16)

    device = torch.cuda.get_device_name()
    print(f"SLA forward vs dense cuDNN SDPA: {device}, {args.preset}, b={args.batch} h={args.heads} "
          f"N={args.tokens} d={args.dim}, {args.dtype}; cuDNN dense forward {dense:.3f} ms, backward {dense_backward:.3f} ms")
    header = (f"{'sparsity':>8} {'k_h%':>5} {'crit/row':>8} {'preagg':>6} {'SLA fwd ms':>10} {'speedup':>8} "
              f"{'mask ms':>8} {'sparse ms':>9} {'sparse x':>8} {'rest ms':>8} {'bwd ms':>8} {'bwd x':>7} {'bwd-stats ms':>12}")
    print(header)
    for row in rows:
        row["cudnn_dense_ms"] = dense
        row["speedup"] = dense / row["forward_ms"]
        row["sparse_only_speedup"] = dense / row["sparse_part_ms"]
        row["cudnn_dense_backward_ms"] = dense_backward
        row["backward_speedup"] = dense_backward / row["backward_ms"]
        rest = row["forward_ms"] - row["mask_prediction_ms"] - row["sparse_part_ms"]
        print(f"{row['sparsity']:>8.1f} {row['critical_percent']:>5.1f} {row['critical_blocks_per_row']:>8d} "
              f"{'yes' if row['pre_aggregation'] else 'no':>6} {row['forward_ms']:>10.3f} {row['speedup']:>7.2f}x "
              f"{row['mask_prediction_ms']:>8.3f} {row['sparse_part_ms']:>9.3f} {row['sparse_only_speedup']:>7.2f}x "
              f"{rest:>8.3f} {row['backward_ms']:>8.3f} {row['backward_speedup']:>6.2f}x "
              f"{row.get('backward_recomputed_statistics_ms', float('nan')):>12.3f}")
    print("rest = linear branch (h_j, z_j, the mask GEMM's H_i, O^l) + Proj + combine; "
          "'sparse x': the block-sparse attention alone against dense cuDNN; bwd ms: with the forward's O^s passed "
          "(its saved L where the sparse part is exact), bwd-stats ms: without (the statistics kernel recomputes L)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": device, "rows": rows}, out, indent=1)
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("--plot: matplotlib is not installed; no plot written")
            return
        sparsity = [row["sparsity"] for row in rows]
        plt.plot(sparsity, [row["speedup"] for row in rows], "o-", label="SLA forward (all launches)")
        plt.plot(sparsity, [row["sparse_only_speedup"] for row in rows], "s--", label="sparse part alone")
        plt.plot(sparsity, [row["backward_speedup"] for row in rows], "^-", label="SLA backward")
        plt.axhline(1.0, color="grey", linewidth=0.5)
        plt.xlabel("sparsity (%)")
        plt.ylabel("speedup over dense cuDNN SDPA")
        plt.title(f"SLA, {device}, N={args.tokens}, d={args.dim}, {args.dtype}")
        plt.legend()
        plt.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
