"""Scaling of sagegen.distributed (issue 30): one GPU against W GPUs of one host, ring and Ulysses, under torchrun.

    PYTHONPATH=python torchrun --standalone --nproc_per_node=2 bench/distributed_bench.py --out DIR [--profile]

For each preset, causal or not, and N (default 64k, 128k, 256k; batch 1, 16 heads, d 128, f16, HND):
- one GPU: sagegen.sageattn on the full sequence, timed on rank 0 alone (the others wait);
- W GPUs: ring_attention (zig-zag shards when causal) and ulysses_attention (contiguous shards) on every rank,
  each call's time the slowest rank's (CUDA events around --repeats calls after --warmup calls, all-reduced MAX;
  the clock starts after an all-reduce, so a rank whose host ran late does not add its lateness to the others').
TOPS = 4 b h N^2 d (halved when causal) over the call; speedup = t(1 GPU) / t(W GPUs); efficiency = speedup / W.

--profile: one ring call (and one Ulysses call) per mask of --causal at --profile-tokens under torch.profiler on every
rank. From the trace's GPU kernels it reports, per rank: the time in NCCL kernels, in other (attention, quantization,
merge) kernels (counted from the end of an all-reduce that aligns the ranks), how much of the NCCL time lies under
other kernels (overlap) and how much is exposed, the time within the call's span when no other kernel runs (compute
idle), and the streams each ran on; rank 0's trace is saved (chrome://tracing / Perfetto). An NCCL P2P kernel runs
from the moment it is launched until its peer's data has moved, so its time includes waiting for the peer: the exposed
part is what matters.

Rank 0 prints the table and writes DIR/distributed_bench_w{W}.json (with `nvidia-smi topo -m`, the GPUs, NCCL's
version and the NVLink-multicast settings, which the script keeps off: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1). --dry-run runs the script on the CPU (gloo, exact attention, tiny sizes).
"""

import argparse
import datetime
import gzip
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "tests"))
import sagegen.distributed as sd  # noqa: E402

sd.disable_nvlink_multicast()  # before torch.distributed creates NCCL communicators

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sagegen  # noqa: E402

DEVICE = "cuda"


def operations(batch, heads, tokens, dim, causal):
    return 4.0 * batch * heads * tokens * tokens * dim / (2.0 if causal else 1.0)


class Timer:
    """Milliseconds per call of `function`, timed over `repeats` calls after `warmup` (CUDA events on the GPU)."""

    def __init__(self, warmup, repeats):
        self.warmup, self.repeats = warmup, repeats

    def __call__(self, function, aligned=False):
        """aligned: every rank calls this; the clock starts when a collective has finished on every rank, so that
        one rank's late start (its host ran behind) is not counted as the others' waiting in the first transfer."""
        for _ in range(self.warmup):
            function()
        if aligned:
            align_ranks()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if aligned:
                align_ranks()  # enqueued: the start event follows the collective on the stream
            start.record()
            for _ in range(self.repeats):
                function()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / self.repeats
        import time
        begin = time.perf_counter()
        for _ in range(self.repeats):
            function()
        return (time.perf_counter() - begin) * 1e3 / self.repeats


def align_ranks(token=None):
    """A small all-reduce: on NCCL the current stream waits for it, so what is enqueued next starts on every GPU at
    about the same moment. token: a 1-element tensor to reduce (made beforehand where no other kernel may precede
    the all-reduce, as in a profile)."""
    dist.all_reduce(torch.zeros(1, device=DEVICE) if token is None else token)


def slowest(milliseconds):
    value = torch.tensor([milliseconds], dtype=torch.float64, device=DEVICE)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value.item()


def make_full(shape, dtype, seed):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    return [torch.randn(shape, generator=generator, device=DEVICE).to(dtype) for _ in range(3)]


# ---- the profile ---------------------------------------------------------------------------------------------------

def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _length(intervals):
    return sum(end - start for start, end in intervals)


def _intersection(a, b):
    result, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            result.append([start, end])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return result


def kernel_overlap(trace_path):
    """From a chrome trace: time (us) in NCCL kernels and in the other kernels, their overlap, the exposed NCCL
    time, the GPU-busy span, and the streams of each class."""
    with open(trace_path) as handle:
        trace = json.load(handle)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    kernels = [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]
    # The call starts where the aligning all-reduce (profile_call) ends: the last AllReduce kernel before the first
    # compute kernel. Earlier kernels (the profiler's and barrier's) and the all-reduce itself are left out.
    first_compute = min((float(e["ts"]) for e in kernels if "nccl" not in e["name"].lower()), default=None)
    origin = max((float(e["ts"]) + float(e.get("dur", 0.0)) for e in kernels
                  if "allreduce" in e["name"].lower() and first_compute is not None
                  and float(e["ts"]) <= first_compute), default=None)
    if origin is not None:
        kernels = [e for e in kernels if float(e["ts"]) >= origin]
    classes = {"nccl": [], "compute": []}
    streams = {"nccl": set(), "compute": set()}
    names = {}
    for event in kernels:
        kind = "nccl" if "nccl" in event["name"].lower() else "compute"
        start = float(event["ts"])
        classes[kind].append((start, start + float(event.get("dur", 0.0))))
        streams[kind].add(event.get("args", {}).get("stream", event.get("tid")))
        key = (kind, event["name"][:80])
        names[key] = names.get(key, 0.0) + float(event.get("dur", 0.0))
    nccl, compute = _union(classes["nccl"]), _union(classes["compute"])
    overlap = _length(_intersection(nccl, compute))
    everything = _union(classes["nccl"] + classes["compute"])
    span = (everything[-1][1] - everything[0][0]) if everything else 0.0
    top = sorted(names.items(), key=lambda item: -item[1])[:12]
    return {"kernels": len(kernels), "span_us": span, "gpu_busy_us": _length(everything),
            "nccl_us": _length(nccl), "compute_us": _length(compute), "nccl_under_compute_us": overlap,
            "nccl_exposed_us": _length(nccl) - overlap,
            "compute_idle_us": span - _length(compute),  # the span without a non-NCCL kernel running
            "streams": {kind: sorted(str(s) for s in values) for kind, values in streams.items()},
            "top_kernels_us": [{"class": kind, "name": name, "us": us} for (kind, name), us in top]}


_profiler_warm = []  # one profile made in this process already


def profile_call(label, function, out_dir, rank):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    function()  # warm
    token = torch.zeros(1, device=DEVICE)  # made here: its fill kernel would be the "first compute kernel" below
    if not _profiler_warm:  # the first profile of a process starts CUPTI; a rank doing so lags the other (run 44-45)
        with torch.profiler.profile(activities=activities):
            align_ranks(token)
            if DEVICE == "cuda":
                torch.cuda.synchronize()
        _profiler_warm.append(True)
    dist.barrier()
    with torch.profiler.profile(activities=activities) as profiler:
        dist.barrier()  # every rank's profiler has started
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        align_ranks(token)  # the call starts after this all-reduce on every GPU; kernel_overlap counts from its end
        function()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
    path = os.path.join(out_dir, f"trace_{label}_rank{rank}.json")
    profiler.export_chrome_trace(path)
    summary = kernel_overlap(path)
    if rank == 0:  # kept, compressed
        with open(path, "rb") as source, gzip.open(path + ".gz", "wb") as target:
            shutil.copyfileobj(source, target)
    os.remove(path)
    return summary


# ---- the run -----------------------------------------------------------------------------------------------------

def run_case(args, timer, preset, causal, tokens, world, rank):
    shape = (1, args.heads, tokens, args.dim)
    q, k, v = make_full(shape, torch.float16, seed=tokens + causal)
    flops = operations(1, args.heads, tokens, args.dim, causal)
    row = {"preset": preset, "causal": causal, "tokens": tokens, "heads": args.heads, "dim": args.dim,
           "world": world}
    single = None
    if rank == 0:
        single = timer(lambda: sagegen.sageattn(q, k, v, is_causal=causal, preset=preset))
    dist.barrier()
    row["single_ms"] = slowest(single if single is not None else 0.0)
    row["single_tops"] = flops / (row["single_ms"] * 1e-3) / 1e12
    for method in args.methods.split(","):
        zigzag = method == "ring" and causal
        shard = ((lambda t: sd.zigzag_shard(t, rank, world, dim=2)) if zigzag
                 else (lambda t: sd.shard_sequence(t, rank, world, dim=2)))
        local = [shard(t) for t in (q, k, v)]
        run = sd.ring_attention if method == "ring" else sd.ulysses_attention
        call = lambda: run(*local, is_causal=causal, preset=preset)  # noqa: E731
        dist.barrier()
        milliseconds = slowest(timer(call, aligned=True))
        row[f"{method}_ms"] = milliseconds
        row[f"{method}_tops"] = flops / (milliseconds * 1e-3) / 1e12
        row[f"{method}_speedup"] = row["single_ms"] / milliseconds
        row[f"{method}_efficiency"] = row[f"{method}_speedup"] / world
        del local
    del q, k, v
    return row


def table(rows, methods):
    header = f"{'preset':<10} {'mask':<6} {'N':>7} {'1 GPU ms':>9} {'TOPS':>6}"
    for method in methods:
        header += f" | {method + ' ms':>11} {'TOPS':>6} {'x':>5} {'eff':>5}"
    lines = [header]
    for row in rows:
        line = (f"{row['preset']:<10} {'causal' if row['causal'] else 'full':<6} {row['tokens']:>7} "
                f"{row['single_ms']:>9.2f} {row['single_tops']:>6.0f}")
        for method in methods:
            line += (f" | {row[method + '_ms']:>11.2f} {row[method + '_tops']:>6.0f} {row[method + '_speedup']:>5.2f}"
                     f" {row[method + '_efficiency']:>5.0%}")
        lines.append(line)
    return "\n".join(lines)


def environment_facts(world):
    facts = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "world": world,
             "torch": torch.__version__,
             "environment": {name: os.environ.get(name) for name in sd.NVLINK_MULTICAST_OFF}}
    if DEVICE == "cuda":
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for key, command in (("topology", ["nvidia-smi", "topo", "-m"]), ("nvidia_smi_l", ["nvidia-smi", "-L"]),
                         ("commit", ["git", "rev-parse", "--short", "HEAD"])):
        try:
            facts[key] = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError) as error:
            facts[key] = f"{' '.join(command)} failed: {error}"
    return facts


def main():
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the results (default $OUT)")
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--tokens", default="65536,131072,262144")
    parser.add_argument("--causal", default="0,1")
    parser.add_argument("--methods", default="ring,ulysses")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile one ring and one Ulysses call")
    parser.add_argument("--profile-tokens", type=int, default=131072)
    parser.add_argument("--profile-preset", default="sage-b")
    parser.add_argument("--dry-run", action="store_true", help="CPU, gloo, exact attention: checks the script")
    args = parser.parse_args()
    if args.dry_run:
        import test_distributed_gpu
        test_distributed_gpu.use_cpu_stand_ins()
        DEVICE = "cpu"
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo" if args.dry_run else "nccl", timeout=datetime.timedelta(minutes=10))
    world, rank = dist.get_world_size(), dist.get_rank()
    os.makedirs(args.out, exist_ok=True)
    timer = Timer(args.warmup, args.repeats)
    methods = args.methods.split(",")
    rows, profiles = [], {}
    result = environment_facts(world) if rank == 0 else None
    path = os.path.join(args.out, f"distributed_bench_w{world}.json")

    def save():  # after every row: a run cut short still leaves what it measured
        if rank == 0:
            result.update({"script": "bench/distributed_bench.py " + " ".join(sys.argv[1:]), "rows": rows,
                           "profiles": profiles, "dry_run": args.dry_run})
            with open(path, "w") as handle:
                json.dump(result, handle, indent=1)

    if rank == 0:
        print(table([], methods), flush=True)
    for preset in args.presets.split(","):
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            for tokens in (int(n) for n in args.tokens.split(",")):
                rows.append(run_case(args, timer, preset, causal, tokens, world, rank))
                save()
                if rank == 0:
                    print(table(rows[-1:], methods).splitlines()[-1], flush=True)
    if args.profile:
        tokens = args.profile_tokens
        q, k, v = make_full((1, args.heads, tokens, args.dim), torch.float16, seed=7)
        for causal in (bool(int(c)) for c in args.causal.split(",")):
            for method in methods:
                zigzag = method == "ring" and causal
                shard = ((lambda t: sd.zigzag_shard(t, rank, world, dim=2)) if zigzag
                         else (lambda t: sd.shard_sequence(t, rank, world, dim=2)))
                local = [shard(t) for t in (q, k, v)]
                run = sd.ring_attention if method == "ring" else sd.ulysses_attention
                mask = "causal" if causal else "full"
                label = f"{method}_{args.profile_preset}_{mask}_N{tokens}_w{world}"
                summary = profile_call(label, lambda: run(*local, is_causal=causal, preset=args.profile_preset),
                                       args.out, rank)
                gathered = [None] * world
                dist.all_gather_object(gathered, summary)
                profiles[label] = gathered
                save()
    if rank == 0:
        print(f"\n== sagegen.distributed scaling, {world} x {result.get('gpus', ['cpu'])[0]}, NCCL "
              f"{result.get('nccl')}, {result['date']}, env {result['environment']}")
        print(result["topology"])
        print(table(rows, methods))
        for label, per_rank in profiles.items():
            print(f"profile {label} (us, per rank): NCCL kernels / of which under compute / exposed; compute "
                  "kernels / compute idle; span")
            for index, summary in enumerate(per_rank):
                print(f"  rank {index}: {summary['nccl_us']:.0f} / {summary['nccl_under_compute_us']:.0f} / "
                      f"{summary['nccl_exposed_us']:.0f}; {summary['compute_us']:.0f} / "
                      f"{summary['compute_idle_us']:.0f}; {summary['span_us']:.0f}  streams {summary['streams']}")
        print(f"wrote {path}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
