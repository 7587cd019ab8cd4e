"""sagegen.distributed on several GPUs of one host (issue 30), under torchrun with NCCL:

    PYTHONPATH=python torchrun --standalone --nproc_per_node=2 python/tests/test_distributed_gpu.py --out DIR

Every rank builds the same full Q, K, V (rank 0's, broadcast), computes the single-GPU result of the preset
(sagegen.sageattn; sagegen.sagebwd_attention for gradients) and exact attention in f32, shards the inputs (zig-zag
for causal ring attention, contiguous otherwise), runs ring_attention and ulysses_attention, gathers the outputs
(and gradients) and compares:

- the preset's own tolerance: the distributed result's error against exact attention (relative L1 over the whole
  tensor) must be at most 1.5 x the single-GPU result's error + 0.001, and its cosine similarity at least 0.995 for
  O (0.99 for dQ and dK, as python/tests/test_gpu.py asks of SageBwd). A ring block is quantized on its own (its
  own K mean, its own scales), so the result is not bitwise the single-GPU one; Ulysses runs the same kernel on
  whole heads and should agree closely. The table also gives the difference to the single-GPU output directly.
- the LSE: its max |error| against exact attention's at most 1.5 x the single-GPU kernel's + 0.01; the refusals (N not divisible by 2W or W, heads not
  divisible by W), and torch.compile(fullgraph=True) of the merge.

Rank 0 prints the table and writes DIR/distributed_test_w{W}.json. Exit status 1 if any check failed.
NVLink multicast stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set before NCCL starts.
"""

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import sagegen.distributed as sd  # noqa: E402

sd.disable_nvlink_multicast()  # before torch.distributed creates NCCL communicators

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import sagegen  # noqa: E402
from sagegen import SageArgumentError  # noqa: E402

DEVICE = "cuda"
RATIO, SLACK = 1.5, 1e-3  # the distributed error may be 1.5 x the single-GPU error + 0.001 (relative L1)


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def use_cpu_stand_ins():
    """--dry-run: the script itself on the CPU (gloo, exact attention in place of every sagegen kernel), so its
    plumbing can be checked without a GPU. Its numbers say nothing about the kernels."""
    global DEVICE
    DEVICE = "cpu"

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **_):
        o, lse = sd.exact_block_forward(q, k, v, is_causal, sm_scale or q.shape[-1] ** -0.5, tensor_layout)
        return (o, lse) if return_lse else o

    def sagebwd_attention(q, k, v, is_causal=False, scale=None, forward_preset=None, return_lse=False):
        o, lse = sd.exact_block_forward(q, k, v, is_causal, scale or q.shape[-1] ** -0.5, "HND")
        return (o, lse) if return_lse else o

    from sagegen import _torch
    sagegen.sageattn, _torch.sageattn, sagegen.sagebwd_attention = sageattn, sageattn, sagebwd_attention
    sd.sage_block_forward = lambda preset="sage-b", tunables=None: sd.exact_block_forward
    sd.sage_block_backward = lambda preset="sagebwd": sd.exact_block_backward
    from sagegen import _backward
    _backward.sagebwd_attention = sagebwd_attention


def metrics(out, reference):
    out, reference = out.double().flatten(), reference.double().flatten()
    return {"cos": torch.nn.functional.cosine_similarity(out, reference, dim=0).item(),
            "rel_l1": ((out - reference).abs().sum() / reference.abs().sum()).item()}


def exact(q, k, v, causal, grad_out=None):
    """Exact attention in f32, one head at a time (the logits of one head fit): O, LSE, and the gradients of
    (O * grad_out).sum() when grad_out is given. HND."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    outs, lses, grads = [], [], ([], [], [])
    for head in range(q.shape[1]):
        qh, kh, vh = (t[:, h:h + 1].float() for t, h in ((q, head), (k, head // group), (v, head // group)))
        if grad_out is not None:
            qh, kh, vh = (t.detach().requires_grad_() for t in (qh, kh, vh))
        with torch.set_grad_enabled(grad_out is not None):
            o, lse = sd.exact_block_forward(qh, kh, vh, causal, scale, "HND")
            if grad_out is not None:
                o.backward(grad_out[:, head:head + 1].float())
                for store, tensor in zip(grads, (qh, kh, vh)):
                    store.append(tensor.grad)
        outs.append(o.detach())
        lses.append(lse.detach())
    result = {"o": torch.cat(outs, 1), "lse": torch.cat(lses, 1)}
    if grad_out is not None:
        result["dq"] = torch.cat(grads[0], 1)
        for name, index in (("dk", 1), ("dv", 2)):  # GQA: sum each group's heads
            parts = torch.cat(grads[index], 1)
            b, h, n, d = parts.shape
            result[name] = parts.view(b, h // group, group, n, d).sum(2)
    return result


class Checks:
    def __init__(self, world, rank):
        self.world, self.rank, self.rows, self.failures = world, rank, [], []

    def record(self, row, failed_reasons):
        row["ok"] = not failed_reasons
        row["failures"] = failed_reasons
        self.rows.append(row)
        self.failures += [f"{row['case']}: {reason}" for reason in failed_reasons]


def make_inputs(kind, shape, heads_kv, dtype, seed):
    b, h, n, d = shape
    if DEVICE == "cpu" and dtype == torch.bfloat16:  # --dry-run: gloo (in older PyTorch) has no bf16
        dtype = torch.float16
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    randn = lambda *size: torch.randn(*size, generator=generator, device=DEVICE)  # noqa: E731
    q, k, v = randn(b, h, n, d), randn(b, heads_kv, n, d), randn(b, heads_kv, n, d)
    if kind == "k_mean":  # a per-channel mean in K (SageAttention's case for smoothing): each ring block's own mean
        k = k + 8.0 * randn(b, heads_kv, 1, d)
    tensors = [t.to(dtype).contiguous() for t in (q, k, v)]
    for t in tensors:  # every rank uses rank 0's inputs
        dist.broadcast(t, 0)
    return tensors


def shard_fns(method, causal, rank, world, dim):
    zigzag = method == "ring" and causal
    if zigzag:
        return (lambda t: sd.zigzag_shard(t, rank, world, dim=dim)), True
    return (lambda t: sd.shard_sequence(t, rank, world, dim=dim)), False


def rank0_first(function):
    """Rank 0 runs first (it compiles the kernels), the others then find them in the kernel cache."""
    if dist.get_rank() == 0:
        result = function()
    dist.barrier()
    if dist.get_rank() != 0:
        result = function()
    return result


def forward_case(checks, preset, causal, kind, layout="HND", dtype=torch.float16, heads_kv=16, tokens=8192):
    world, rank = checks.world, checks.rank
    q, k, v = make_inputs(kind, (1, 16, tokens, 128), heads_kv, dtype, seed=len(checks.rows) + 1)
    reference = exact(q, k, v, causal)
    to_layout = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2).contiguous())  # noqa: E731
    seq = 2 if layout == "HND" else 1
    single_o, single_lse = rank0_first(lambda: sagegen.sageattn(
        to_layout(q), to_layout(k), to_layout(v), tensor_layout=layout, is_causal=causal, return_lse=True,
        preset=preset))
    from_layout = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))  # noqa: E731
    single_o = from_layout(single_o)
    single = metrics(single_o, reference["o"])
    for method in ("ring", "ulysses"):
        shard, zigzag = shard_fns(method, causal, rank, world, seq)
        local = [shard(to_layout(t)) for t in (q, k, v)]
        run = sd.ring_attention if method == "ring" else sd.ulysses_attention
        o, lse = run(*local, is_causal=causal, tensor_layout=layout, preset=preset, return_lse=True)
        synchronize()
        o = from_layout(sd.gather_sequence(o, dim=seq, zigzag=zigzag))
        lse = sd.gather_sequence(lse, dim=2, zigzag=zigzag)
        mine = metrics(o, reference["o"])
        row = {"case": f"{method} fwd {preset} {'causal' if causal else 'full'} {kind} {layout} "
                       f"{str(dtype).replace('torch.', '')} h16/{heads_kv} N={tokens}",
               "method": method, "preset": preset, "causal": causal, "inputs": kind, "layout": layout,
               "dtype": str(dtype), "heads_kv": heads_kv, "tokens": tokens, "world": world,
               "single_rel_l1": single["rel_l1"], "single_cos": single["cos"],
               "dist_rel_l1": mine["rel_l1"], "dist_cos": mine["cos"],
               "dist_vs_single_max_abs": (o.float() - single_o.float()).abs().max().item(),
               "dist_vs_single_cos": metrics(o, single_o)["cos"],
               "lse_vs_single_max_abs": (lse - single_lse).abs().max().item(),
               "lse_vs_exact_max_abs": (lse - reference["lse"]).abs().max().item()}
        reasons = []
        if not mine["rel_l1"] <= RATIO * single["rel_l1"] + SLACK:
            reasons.append(f"rel_l1 {mine['rel_l1']:.5f} > {RATIO} x single {single['rel_l1']:.5f} + {SLACK}")
        if not mine["cos"] >= 0.995:
            reasons.append(f"cos {mine['cos']:.6f} < 0.995")
        single_lse_error = (single_lse - reference["lse"]).abs().max().item()
        row["single_lse_vs_exact_max_abs"] = single_lse_error
        if not row["lse_vs_exact_max_abs"] <= RATIO * single_lse_error + 0.01:
            reasons.append(f"LSE error {row['lse_vs_exact_max_abs']:.4f} > {RATIO} x single {single_lse_error:.4f} "
                           "+ 0.01")
        checks.record(row, reasons)


def backward_case(checks, causal, dtype=torch.bfloat16, heads_kv=16, tokens=8192, preset="sage-b"):
    world, rank = checks.world, checks.rank
    q, k, v = make_inputs("normal", (1, 16, tokens, 128), heads_kv, dtype, seed=100 + len(checks.rows))
    (grad_out,) = make_inputs("normal", (1, 16, tokens, 128), 16, dtype, seed=200 + len(checks.rows))[:1]
    reference = exact(q, k, v, causal, grad_out)

    def single_run():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = sagegen.sagebwd_attention(*leaves, is_causal=causal, forward_preset=preset)
        out.backward(grad_out)
        return [out.detach()] + [t.grad for t in leaves]
    single = dict(zip(("o", "dq", "dk", "dv"), rank0_first(single_run)))
    for method in ("ring", "ulysses"):
        shard, zigzag = shard_fns(method, causal, rank, world, 2)
        local = [shard(t).requires_grad_() for t in (q, k, v)]
        run = sd.ring_attention if method == "ring" else sd.ulysses_attention
        o = run(*local, is_causal=causal, preset=preset)
        o.backward(shard(grad_out))
        synchronize()
        mine = {"o": sd.gather_sequence(o.detach(), dim=2, zigzag=zigzag)}
        for name, tensor in zip(("dq", "dk", "dv"), local):
            mine[name] = sd.gather_sequence(tensor.grad, dim=2, zigzag=zigzag)
        row = {"case": f"{method} fwd+bwd {preset}+sagebwd {'causal' if causal else 'full'} "
                       f"{str(dtype).replace('torch.', '')} h16/{heads_kv} N={tokens}",
               "method": method, "preset": preset, "causal": causal, "dtype": str(dtype), "heads_kv": heads_kv,
               "tokens": tokens, "world": world, "backward": True}
        reasons = []
        for name, min_cos in (("o", 0.995), ("dq", 0.99), ("dk", 0.99), ("dv", 0.995)):
            s, m = metrics(single[name], reference[name]), metrics(mine[name], reference[name])
            row[f"{name}_single_rel_l1"], row[f"{name}_dist_rel_l1"] = s["rel_l1"], m["rel_l1"]
            row[f"{name}_single_cos"], row[f"{name}_dist_cos"] = s["cos"], m["cos"]
            row[f"{name}_dist_vs_single_cos"] = metrics(mine[name], single[name])["cos"]
            if not m["rel_l1"] <= RATIO * s["rel_l1"] + SLACK:
                reasons.append(f"{name} rel_l1 {m['rel_l1']:.5f} > {RATIO} x single {s['rel_l1']:.5f} + {SLACK}")
            if not m["cos"] >= min_cos:
                reasons.append(f"{name} cos {m['cos']:.6f} < {min_cos}")
        checks.record(row, reasons)


def refusal_case(checks):
    world = checks.world
    reasons = []
    x = torch.zeros(1, 4, 8 * world + 2, 128, dtype=torch.float16, device=DEVICE)
    for label, call, expected in (
            ("zigzag_shard N % 2W", lambda: sd.zigzag_shard(x, checks.rank, world, dim=2), "x: "),
            ("shard_sequence N % W", lambda: sd.shard_sequence(x[:, :, :8 * world + 1], checks.rank, world, 2), "x: "),
            ("causal ring, odd local tokens", lambda: sd.ring_attention(x[:, :, :3], x[:, :, :3], x[:, :, :3],
                                                                        is_causal=True), "q: "),
            ("ulysses heads % W", lambda: sd.ulysses_attention(x[:, :1], x[:, :1], x[:, :1]), "q: ")):
        if world == 1 and label.startswith("ulysses"):
            continue
        try:
            call()
            reasons.append(f"{label}: nothing was raised")
        except SageArgumentError as error:
            if not str(error).startswith(expected):
                reasons.append(f"{label}: message {str(error)!r} does not name {expected!r}")
    checks.record({"case": "refusals (SageArgumentError naming the argument)", "world": world}, reasons)


def compile_case(checks):
    reasons = []
    outs = [torch.randn(1, 8, 1024, 128, device=DEVICE, dtype=torch.float16) for _ in range(3)]
    lses = [torch.randn(1, 8, 1024, device=DEVICE) for _ in range(3)]
    lses[1][0, 0, :7] = float("-inf")
    eager = sagegen.merge_attention(outs, lses)
    try:
        compiled = torch.compile(sagegen.merge_attention, fullgraph=True)(outs, lses)
        for a, b in zip(eager, compiled):
            if not torch.allclose(a.float(), b.float(), atol=2e-3, rtol=1e-3):
                reasons.append(f"compiled merge differs by {(a.float() - b.float()).abs().max().item()}")
    except Exception as error:  # noqa: BLE001 - a failure to compile is the finding
        reasons.append(f"torch.compile failed: {type(error).__name__}: {error}"[:300])
    checks.record({"case": "merge_attention under torch.compile(fullgraph=True)", "world": checks.world}, reasons)


def table(rows):
    lines = [f"{'case':<62} {'ok':>3} {'single rel_l1':>13} {'dist rel_l1':>11} {'dist cos':>9} "
             f"{'vs single cos':>13} {'|dLSE|':>7}"]  # |dLSE|: max |LSE - single-GPU LSE|
    for row in rows:
        if "dist_rel_l1" in row:
            lines.append(f"{row['case']:<62} {'yes' if row['ok'] else 'NO':>3} {row['single_rel_l1']:>13.5f} "
                         f"{row['dist_rel_l1']:>11.5f} {row['dist_cos']:>9.6f} {row['dist_vs_single_cos']:>13.6f} "
                         f"{row['lse_vs_single_max_abs']:>7.4f}")
        elif row.get("backward"):
            for name in ("o", "dq", "dk", "dv"):
                lines.append(f"{row['case'] + ' ' + name:<62} {'yes' if row['ok'] else 'NO':>3} "
                             f"{row[name + '_single_rel_l1']:>13.5f} {row[name + '_dist_rel_l1']:>11.5f} "
                             f"{row[name + '_dist_cos']:>9.6f} {row[name + '_dist_vs_single_cos']:>13.6f} "
                             f"{'':>7}")
        else:
            lines.append(f"{row['case']:<62} {'yes' if row['ok'] else 'NO':>3}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for the JSON (default $OUT)")
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--tokens", type=int, default=8192, help="N (divisible by 2 x the world size)")
    parser.add_argument("--skip-backward", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU with gloo and exact attention in place of sagegen's kernels: checks this "
                             "script, not the kernels")
    args = parser.parse_args()
    if args.dry_run:
        use_cpu_stand_ins()
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("gloo" if args.dry_run else "nccl", timeout=datetime.timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    checks = Checks(world, rank)
    crashed = None
    try:
        for preset in args.presets.split(","):
            for causal in (False, True):
                for kind in ("normal", "k_mean"):
                    forward_case(checks, preset, causal, kind, tokens=args.tokens)
        first = args.presets.split(",")[0]
        forward_case(checks, first, True, "normal", layout="NHD", tokens=args.tokens)
        forward_case(checks, first, True, "normal", dtype=torch.bfloat16, heads_kv=4, tokens=args.tokens)
        if not args.skip_backward:
            for causal in (False, True):
                backward_case(checks, causal, tokens=args.tokens)
            backward_case(checks, True, heads_kv=4, tokens=args.tokens)
        refusal_case(checks)
        if hasattr(torch, "compile"):
            compile_case(checks)
        else:
            checks.record({"case": "merge_attention under torch.compile(fullgraph=True)", "world": checks.world},
                          ["torch.compile is not in this PyTorch: not run"])
    except Exception:  # noqa: BLE001 - reported in the JSON and the exit status
        crashed = traceback.format_exc()
        print(f"rank {rank}: {crashed}", file=sys.stderr)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        try:
            topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError) as error:
            topology = f"nvidia-smi topo -m failed: {error}"
        result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (--dry-run)", "world": world,
                  "torch": torch.__version__,
                  "nccl": ".".join(map(str, torch.cuda.nccl.version())) if DEVICE == "cuda" else None,
                  "environment": {name: os.environ.get(name) for name in sd.NVLINK_MULTICAST_OFF},
                  "topology": topology, "tolerance": f"rel_l1 <= {RATIO} x single + {SLACK}; cos >= 0.995 "
                  "(dq, dk 0.99)", "rows": checks.rows, "failures": checks.failures, "crashed": crashed}
        path = os.path.join(args.out, f"distributed_test_w{world}.json")
        with open(path, "w") as handle:
            json.dump(result, handle, indent=1)
        print(f"== sagegen.distributed on {world} x {result['gpu']}, NCCL {result['nccl']}, "
              f"env {result['environment']}")
        print(table(checks.rows))
        print("\n".join(f"FAILED {failure}" for failure in checks.failures))
        passed = sum(row["ok"] for row in checks.rows)
        print(f"{passed} passed, {len(checks.rows) - passed + (1 if crashed else 0)} failed"
              + (" (one crashed: see above)" if crashed else ""))
        print(f"wrote {path}")
    ok = not checks.failures and crashed is None
    flag = torch.tensor([0 if ok else 1], device=DEVICE)
    if crashed is None:
        dist.all_reduce(flag)
        dist.destroy_process_group()
    sys.exit(1 if flag.item() else 0)


if __name__ == "__main__":
    main()
