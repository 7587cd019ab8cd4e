"""One call of each forward implementation on one shape, for a profiler to capture (ncu, nsys, compute-sanitizer).

    ncu --set full -k regex:'sage_attention|qk_int8_sv_f8' -c 4 python3 bench/profile_forward.py --sageattn DIR

Runs the sagegen presets given (whole call: prologue and attention kernel) and, with --sageattn, SageAttention2's sm90
FP8 path on the same inputs, each twice (the first call builds; profile the second with ncu's --launch-skip or -c).
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from attention_bench import load_sageattention, sageattention_calls  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="sage2-fp8")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--tunables", default=None, help="tunables for the sagegen presets, e.g. block_kv=128")
    parser.add_argument("--sageattn", help="SageAttention2's built source directory")
    args = parser.parse_args()
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.batch, args.heads, args.tokens, args.dim, dtype=torch.float16, device="cuda")
               for _ in range(3))
    for preset in args.presets.split(","):
        attention = sagegen.Attention(preset, head_dim=args.dim, causal=args.causal, tunables=args.tunables)
        for _ in range(2):
            attention(q, k, v)
        print(attention.describe())
    if args.sageattn:
        full, kernel = sageattention_calls(load_sageattention(args.sageattn), q, k, v, args.causal)
        for _ in range(2):
            kernel()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
