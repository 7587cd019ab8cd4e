"""Where an end-to-end call's time goes: each GPU kernel's mean duration, and the GPU's idle time between them.

    python3 bench/profile_e2e.py --presets sage2-fp8,sage-b --tokens 1024,16384

For each shape (16k tokens per call, hidden 2048, as bench/attention_bench.py), --calls back-to-back calls of
`sagegen.sageattn` run under torch.profiler after a warm-up. The table lists the kernels of one call with their mean
duration, then the wall time per call (CUDA events around the loop) against the sum of kernel time: the difference is
time the GPU spends idle (host-bound launches) or in work no kernel accounts for.
"""

import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="sage2-fp8,sage-b")
    parser.add_argument("--tokens", default="1024,16384")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}; f16, HND, 16k tokens x hidden 2048 per call")
    for preset in args.presets.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            heads = 2048 // args.dim
            batch = max(1, 16384 // tokens)
            q, k, v = (torch.randn(batch, heads, tokens, args.dim, device="cuda", dtype=torch.float16)
                       for _ in range(3))
            for _ in range(5):
                sagegen.sageattn(q, k, v, preset=preset)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start.record()
                for _ in range(args.calls):
                    sagegen.sageattn(q, k, v, preset=preset)
                end.record()
                torch.cuda.synchronize()
            wall_us = start.elapsed_time(end) * 1e3 / args.calls
            kernels = collections.defaultdict(float)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    kernels[event.name] += event.device_time / args.calls  # us per call
            busy = sum(kernels.values())
            print(f"{preset} b={batch} h={heads} N={tokens}: wall {wall_us:.1f} us per call, kernels {busy:.1f} us, "
                  f"idle/unaccounted {wall_us - busy:.1f} us")
            for name, us in sorted(kernels.items(), key=lambda item: -item[1]):
                print(f"    {us:9.1f} us  {name[:100]}")


if __name__ == "__main__":
    main()
