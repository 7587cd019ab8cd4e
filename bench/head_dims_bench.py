"""Speed and accuracy per head dim through sagegen.sageattn (issue 28), beside PyTorch SDPA (flash, cuDNN) in one run.

    PYTHONPATH=python python3 bench/head_dims_bench.py --json OUT.json

16k tokens per call at hidden 2048 (batch = 16384 / N, heads = 2048 // d), f16, HND, non-causal, K with per-channel
offsets (std 3). For each head dim, N and preset: sageattn end to end (the head dim it ran at: the caller's, or
zero-padded by python/sagegen/_head_dim.py, and the schedule that ran it), and where the library has a kernel at the
caller's d, that kernel unpadded (sagegen.Attention at d) for comparison; on sm_90a, beyond d = 128 where the wgmma
schedule runs the caller's d itself, the mma.sync schedule's kernel at d beside it ("@sm80"). TOPS = 4 b h N^2 d with the caller's d; rel-L1 of the first batch
element against f32 SDPA. Medians of --rounds rounds of 15 timed calls each.
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
from sagegen._head_dim import kernel_head_dim  # noqa: E402
from cuda_timing import time_ms  # noqa: E402


def tops(batch, heads, tokens, dim, milliseconds):
    return 4.0 * batch * heads * tokens * tokens * dim / (milliseconds * 1e-3) / 1e12


def sdpa(backend):
    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)
    return run


def schedule_of(attention):
    """The schedule a sagegen.Attention runs (its runner's describe(): "<variant> on <arch> with <schedule> (...")."""
    text = attention.describe()
    return text.split(" with ", 1)[1].split(" ", 1)[0] if " with " in text else text


def forced(preset, dim, schedule):
    """sagegen.Attention at `dim` on `schedule`: its runner is built (describe()) while $SAGEGEN_SCHEDULE names it."""
    attention = sagegen.Attention(preset, head_dim=dim)
    previous = os.environ.get("SAGEGEN_SCHEDULE")
    os.environ["SAGEGEN_SCHEDULE"] = schedule
    try:
        attention.describe()
    finally:
        if previous is None:
            del os.environ["SAGEGEN_SCHEDULE"]
        else:
            os.environ["SAGEGEN_SCHEDULE"] = previous
    return attention


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="32,40,48,72,80,96,112,160,192,256")
    parser.add_argument("--tokens", default="1024,4096,16384")
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    capability = torch.cuda.get_device_capability()
    print(f"TOPS and rel-L1, {torch.cuda.get_device_name()}, 16k tokens x hidden 2048 per call, f16, K offsets")
    rows = []
    for dim in map(int, args.dims.split(",")):
        for tokens in map(int, args.tokens.split(",")):
            batch, heads = max(1, 16384 // tokens), 2048 // dim
            generator = torch.Generator(device="cuda").manual_seed(dim * 100003 + tokens)
            q, k, v = (torch.randn(batch, heads, tokens, dim, generator=generator, device="cuda").half()
                       for _ in range(3))
            k = k + 3 * torch.randn(dim, generator=generator, device="cuda").half()
            expected = F.scaled_dot_product_attention(q[:1].float(), k[:1].float(), v[:1].float())
            timed = {"flash": sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
            ran_at, ran_on = {}, {}
            for preset in args.presets.split(","):
                timed[preset] = lambda q, k, v, preset=preset: sagegen.sageattn(q, k, v, preset=preset)
                ran_at[preset] = kernel_head_dim(dim, tokens, preset, capability)
                try:
                    ran_on[preset] = schedule_of(sagegen.Attention(preset, head_dim=ran_at[preset]))
                except (sagegen.SageUnsupportedError, RuntimeError) as error:
                    ran_on[preset] = str(error).splitlines()[0][:160]
                # the library's own kernel at the caller's d beside (where the mma.sync schedule, sm_80's, has one)
                if ran_at[preset] != dim and kernel_head_dim(dim, tokens, preset, (8, 0)) == dim:
                    timed[preset + "@d"] = (lambda attention: lambda q, k, v: attention(q, k, v))(
                        sagegen.Attention(preset, head_dim=dim))
                elif dim > 128 and ran_on[preset] == "sm90.wgmma_tma" and \
                        kernel_head_dim(dim, tokens, preset, (8, 0)) == dim:
                    try:
                        timed[preset + "@sm80"] = (lambda attention: lambda q, k, v: attention(q, k, v))(
                            forced(preset, dim, "sm80.mma_sync"))
                    except (sagegen.SageUnsupportedError, RuntimeError) as error:
                        print(f"d {dim} {preset}@sm80: {str(error).splitlines()[0][:160]}")
            row = {"d": dim, "N": tokens, "batch": batch, "heads": heads}
            samples = {name: [] for name in timed}
            errors = {}
            for name, function in timed.items():
                try:
                    out = function(q, k, v)
                    errors[name] = ((out[:1].float() - expected).abs().sum() / expected.abs().sum()).item()
                except (sagegen.SageUnsupportedError, RuntimeError) as error:
                    errors[name] = str(error).splitlines()[0][:160]
            for _ in range(max(1, args.rounds)):
                for name, function in timed.items():
                    if isinstance(errors[name], float):
                        samples[name].append(time_ms(lambda: function(q, k, v)))
            line = f"d {dim:>3} N {tokens:>5}"
            cudnn = tops(batch, heads, tokens, dim, statistics.median(samples["cudnn"]))
            for name in timed:
                if not isinstance(errors[name], float):
                    row[name] = {"error": errors[name]}
                    line += f" | {name} refused"
                    continue
                value = tops(batch, heads, tokens, dim, statistics.median(samples[name]))
                row[name] = {"tops": value, "x_cudnn": value / cudnn, "rel_l1": errors[name]}
                if name in ran_at:
                    row[name]["ran_at_head_dim"] = ran_at[name]
                    row[name]["schedule"] = ran_on[name]
                at = f"@{ran_at[name]}" if name in ran_at and ran_at[name] != dim else ""
                line += f" | {name}{at} {value:.0f} ({value / cudnn:.2f}x, {errors[name]:.4f})"
            print(line, flush=True)
            rows.append(row)
            del q, k, v
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
