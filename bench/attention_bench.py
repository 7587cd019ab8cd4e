"""Speed of sagegen kernels against PyTorch SDPA (flash and cuDNN backends), measured in one run.

Shapes as the issue fixes them: 16k tokens per call, hidden 2048 (batch = 16384 / N, at least 1, heads = 2048 / d),
fp16, HND. TOPS = 4 * b * h * N^2 * d (halved when causal) over the full call, quantization included.
The quantization prologue and the attention kernel are also timed alone ("kernel" TOPS: the attention launch only).
--schedules runs each preset under each named schedule (SAGEGEN_SCHEDULE), e.g. sm90.wgmma_tma,sm80.mma_sync. Each number is the median over --rounds rounds, each round timing
every implementation of the row in turn (median of 15 calls after warm-up), so clock or thermal drift during a row
affects all columns alike. Prints one table; --json writes the rows.
"""

import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sagegen  # noqa: E402
from cuda_timing import time_ms  # noqa: E402




def tops(batch, heads, tokens, dim, causal, milliseconds):
    operations = 4.0 * batch * heads * tokens * tokens * dim / (2.0 if causal else 1.0)
    return operations / (milliseconds * 1e-3) / 1e12


def load_sageattention(directory):
    """SageAttention2, built from its own source (setup.py build_ext --inplace) in `directory`."""
    sys.path.insert(0, os.path.abspath(directory))
    import sageattention  # noqa: E402
    from sageattention import sm90_compile  # noqa: E402
    from sageattention.quant import per_channel_fp8, per_warp_int8  # noqa: E402
    return {"module": sageattention, "sm90": sm90_compile, "per_channel_fp8": per_channel_fp8,
            "per_warp_int8": per_warp_int8}


def sageattention_calls(sa, q, k, v, causal):
    """SageAttention2's sm90 path for HND f16 inputs: the whole call (its own quantization included), and its attention
    launch alone on inputs quantized once the way that call quantizes them (K smoothed, per-warp Q/K, per-channel
    e4m3 V, two-level f32 accumulation)."""
    full = lambda: sa["module"].sageattn_qk_int8_pv_fp8_cuda_sm90(  # noqa: E731
        q, k, v, tensor_layout="HND", is_causal=causal, qk_quant_gran="per_warp", pv_accum_dtype="fp32+fp32")
    km = k.mean(dim=2, keepdim=True)
    q_int8, q_scale, k_int8, k_scale = sa["per_warp_int8"](q, k, km, tensor_layout="HND", BLKQ=64, WARPQ=16,
                                                           BLKK=128)
    pad = (128 - k.size(2) % 128) % 128
    v_padded = torch.cat([v, v.new_zeros(v.size(0), v.size(1), pad, v.size(3))], dim=2) if pad else v
    v_fp8, v_scale, _ = sa["per_channel_fp8"](v_padded, tensor_layout="HND", smooth_v=False)
    o = torch.empty_like(q)
    scale = q.size(-1) ** -0.5
    kernel = lambda: sa["sm90"].qk_int8_sv_f8_accum_f32_fuse_v_scale_attn_inst_buf(  # noqa: E731
        q_int8, k_int8, v_fp8, o, q_scale, k_scale, v_scale, 1, int(causal), 2, scale, 0)
    return full, kernel


def sdpa(backend, q, k, v, causal):
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", default="sage-b", help="comma-separated presets")
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--tokens", default="512,1024,2048,4096,8192,16384,32768")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--tunables", default="",
                        help="';'-separated tunables to measure besides the defaults, e.g. 'warps=4;stages=2'")
    parser.add_argument("--schedules", default="",
                        help="comma-separated schedules to run each preset with (default: the best for the GPU)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per row (median)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--sageattn", help="a directory holding SageAttention2's built `sageattention` package: adds its "
                        "sm90 FP8 kernel (end to end, and its attention launch alone) beside SDPA")
    args = parser.parse_args()
    sageattention = load_sageattention(args.sageattn) if args.sageattn else None
    # Columns: each preset with its default tunables, then with each alternative.
    schedules = [name for name in args.schedules.split(",") if name] or [None]
    configs = [(preset, None, schedule) for preset in args.presets.split(",") for schedule in schedules]
    configs += [(preset, tunables, schedule) for preset in args.presets.split(",")
                for tunables in args.tunables.split(";") if tunables for schedule in schedules]
    torch.manual_seed(0)
    rows = []
    header = f"{'d':>4} {'causal':>6} {'N':>6} {'flash':>7} {'cudnn':>7}"
    for preset, tunables, schedule in configs:
        label = preset if tunables is None else f"[{tunables}]"
        if schedule:
            label += "@" + schedule.split(".")[0]
        header += f" {label:>14} {'x flash':>8} {'x cudnn':>8} {'kernel':>7} {'prolog us':>9}"
    if sageattention:
        header += f" {'sageattn':>9} {'x cudnn':>8} {'kernel':>7}"
    print("TOPS (fp16, 16k tokens x hidden 2048 per call, " + torch.cuda.get_device_name() + ")")
    print(header)
    for dim in map(int, args.dims.split(",")):
        kernels = {}
        for causal in map(int, args.causal.split(",")):
            for tokens in map(int, args.tokens.split(",")):
                batch, heads = max(1, 16384 // tokens), 2048 // dim
                q, k, v = (torch.randn(batch, heads, tokens, dim, dtype=torch.float16, device="cuda")
                           for _ in range(3))
                row = {"d": dim, "causal": bool(causal), "N": tokens, "batch": batch, "heads": heads}
                # Everything this row times, by name; then interleaved rounds, median per name.
                timed = {
                    "flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, bool(causal)),
                    "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, bool(causal)),
                }
                for preset, tunables, schedule in configs:
                    key = (preset, tunables, schedule, causal)
                    if key not in kernels:
                        # The runner is built at the first call: the schedule must be set then.
                        os.environ["SAGEGEN_SCHEDULE"] = schedule or ""
                        kernels[key] = sagegen.Attention(preset, head_dim=dim, causal=bool(causal), tunables=tunables)
                        kernels[key](q, k, v)
                        os.environ.pop("SAGEGEN_SCHEDULE")
                    attention = kernels[key]
                    timed[("full", key)] = lambda attention=attention: attention(q, k, v)
                    timed[("prologue", key)] = lambda attention=attention: attention(
                        q, k, v, phase=sagegen.PHASE_PROLOGUE)
                    timed[("kernel", key)] = lambda attention=attention: attention(
                        q, k, v, phase=sagegen.PHASE_ATTENTION)
                if sageattention:
                    full, kernel_only = sageattention_calls(sageattention, q, k, v, bool(causal))
                    timed["sageattn"] = full
                    timed["sageattn_kernel"] = kernel_only
                samples = {name: [] for name in timed}
                for _ in range(max(1, args.rounds)):
                    for name, function in timed.items():
                        samples[name].append(time_ms(function))
                milliseconds = {name: statistics.median(values) for name, values in samples.items()}
                row["flash"] = tops(batch, heads, tokens, dim, causal, milliseconds["flash"])
                row["cudnn"] = tops(batch, heads, tokens, dim, causal, milliseconds["cudnn"])
                line = f"{dim:>4} {causal:>6} {tokens:>6} {row['flash']:>7.1f} {row['cudnn']:>7.1f}"
                for preset, tunables, schedule in configs:
                    key = (preset, tunables, schedule, causal)
                    full = milliseconds[("full", key)]
                    prologue = milliseconds[("prologue", key)]
                    kernel = tops(batch, heads, tokens, dim, causal, milliseconds[("kernel", key)])
                    value = tops(batch, heads, tokens, dim, causal, full)
                    name = preset if tunables is None else f"{preset}[{tunables}]"
                    row[name if schedule is None else f"{name}@{schedule}"] = {
                        "tops": value, "ms": full, "kernel_tops": kernel, "prologue_us": prologue * 1e3}
                    line += (f" {value:>14.1f} {value / row['flash']:>8.2f} {value / row['cudnn']:>8.2f}"
                             f" {kernel:>7.1f} {prologue * 1e3:>9.1f}")
                if sageattention:
                    row["sageattn"] = {
                        "tops": tops(batch, heads, tokens, dim, causal, milliseconds["sageattn"]),
                        "kernel_tops": tops(batch, heads, tokens, dim, causal, milliseconds["sageattn_kernel"])}
                    line += (f" {row['sageattn']['tops']:>9.1f} {row['sageattn']['tops'] / row['cudnn']:>8.2f}"
                             f" {row['sageattn']['kernel_tops']:>7.1f}")
                print(line, flush=True)
                rows.append(row)
                del q, k, v
    print("JIT (first construction of each kernel; [built N ms] = NVRTC compile time, [disk]/[memory] = cache hit):")
    for attention in kernels.values():
        print("  " + attention.describe())
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
