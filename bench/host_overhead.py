"""Host time per attention call at a tiny shape (issue 24: the host path per call should cost no more than SDPA's;
issue 28: a packed variable-length call should cost what the dense one does).

At b=1, h=8, N=128, d=128 the kernels take a few microseconds, so the wall time of many back-to-back calls is the
host's: Python, the op dispatch, ctypes, the library's checks and the launches. Each implementation runs --calls
calls after a warm-up; the table gives microseconds per call (median of --rounds), measured with the CPU clock and
a final synchronize. sageattn_varlen runs the same tokens packed: b sequences of N tokens each ([b * N, h, d], NHD).
--profile / --profile-varlen print cProfile's top entries for one sagegen path, to show where the time goes.
"""

import argparse
import contextlib
import ctypes
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _package_directory():
    """--package DIR: the sagegen Python package to time (an A/B against another checkout's package and library,
    with $SAGEGEN_LIBRARY naming that library); default: this checkout's python/."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--package", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    return early.parse_known_args()[0].package


sys.path.insert(0, _package_directory())
import sagegen  # noqa: E402
from sagegen._library import DTYPE_F16  # noqa: E402


def per_call_us(run, calls, rounds, context=None):
    with context if context is not None else contextlib.nullcontext():
        return _per_call_us(run, calls, rounds)


def _per_call_us(run, calls, rounds):
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def c_call(attention, q, k, v, out, workspace, phase=sagegen.PHASE_ALL):
    """sage_attention_run alone, its arguments built once: the library's own host time (checks, launches). phase:
    PHASE_PROLOGUE or PHASE_ATTENTION for one side's share."""
    from sagegen._library import RunArgs, check, library
    from sagegen._tensors import describe, layout_code
    runner = attention._runner(q.device.index, describe(q, "q").dtype)
    descs = {name: describe(tensor, name) for name, tensor in (("q", q), ("k", k), ("v", v), ("o", out))}
    args = RunArgs()
    args.layout, args.phase = layout_code("HND"), phase
    args.causal_alignment = attention._alignment
    for name, desc in descs.items():
        setattr(args, name, ctypes.pointer(desc))
    args.workspace, args.workspace_bytes = workspace.data_ptr(), workspace.numel()
    args.stream = torch.cuda.current_stream().cuda_stream
    run, handle, pointer = library().sage_attention_run, runner.handle, ctypes.byref(args)
    return lambda: check(run(handle, pointer))


def varlen_c_call(attention, q, k, v, cu_seqlens, n, out, workspace):
    """sage_attention_run_varlen alone, its arguments built once (as c_call)."""
    from sagegen._library import VarlenArgs, check, library
    from sagegen._tensors import describe
    runner = attention._runner(q.device.index, describe(q, "q").dtype)
    descs = [describe(tensor, name) for name, tensor in (("q", q), ("k", k), ("v", v), ("o", out),
                                                         ("cu_seqlens_q", cu_seqlens), ("cu_seqlens_kv", cu_seqlens))]
    args = VarlenArgs()
    args.causal_alignment = attention._alignment
    for name, desc in zip(("q", "k", "v", "o", "cu_seqlens_q", "cu_seqlens_kv"), descs):
        setattr(args, name, ctypes.pointer(desc))
    args.max_seqlen_q = args.max_seqlen_kv = n
    args.workspace, args.workspace_bytes = workspace.data_ptr(), workspace.numel()
    args.stream = torch.cuda.current_stream().cuda_stream
    run, handle, pointer = library().sage_attention_run_varlen, runner.handle, ctypes.byref(args)
    return lambda: check(run(handle, pointer))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="1,8,128,128", help="b,h,N,d")
    parser.add_argument("--presets", default="sage-b,sage2-fp8")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--package", help="the directory holding the sagegen package to time (default: python/ of "
                        "this checkout); with $SAGEGEN_LIBRARY for its library")
    parser.add_argument("--profile", action="store_true", help="cProfile of --calls sageattn calls")
    parser.add_argument("--profile-varlen", action="store_true", help="cProfile of --calls sageattn_varlen calls")
    args = parser.parse_args()
    b, h, n, d = (int(x) for x in args.shape.split(","))
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3))

    # The same tokens packed (uniform lengths): [b * N, h, d] views of NHD copies, offsets 0, N, 2N, ...
    packed = [t.transpose(1, 2).contiguous().view(b * n, h, d) for t in (q, k, v)]
    cu_seqlens = torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")

    runs = {}  # name -> (callable, context entered once around the timed calls)
    for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION), ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
        runs[name] = (lambda: F.scaled_dot_product_attention(q, k, v), sdpa_kernel(backend))
    for preset in args.presets.split(","):
        runs[f"{preset} sageattn"] = (lambda preset=preset: sagegen.sageattn(q, k, v, preset=preset), None)
        attention = sagegen.Attention(preset, head_dim=d)
        out = torch.empty_like(q)
        workspace = torch.empty(max(attention.workspace_bytes(q, k), 1), dtype=torch.uint8, device="cuda")
        runs[f"{preset} Attention(out=, workspace=)"] = (
            lambda attention=attention, out=out, workspace=workspace: attention(q, k, v, out=out, workspace=workspace),
            None)
        runs[f"{preset} C call alone"] = (c_call(attention, q, k, v, out, workspace), None)
        runs[f"{preset} C call, prologue phase"] = (
            c_call(attention, q, k, v, out, workspace, sagegen.PHASE_PROLOGUE), None)
        runs[f"{preset} C call, attention phase"] = (
            c_call(attention, q, k, v, out, workspace, sagegen.PHASE_ATTENTION), None)
        if hasattr(sagegen, "sageattn_varlen"):
            runs[f"{preset} sageattn_varlen"] = (
                lambda preset=preset: sagegen.sageattn_varlen(*packed, cu_seqlens, cu_seqlens, n, n, preset=preset),
                None)
            runs[f"{preset} sageattn_varlen(check_offsets=False)"] = (
                lambda preset=preset: sagegen.sageattn_varlen(*packed, cu_seqlens, cu_seqlens, n, n, preset=preset,
                                                              check_offsets=False), None)
            varlen_out = torch.empty_like(packed[0])
            varlen_bytes = attention._runner(q.device.index, DTYPE_F16).varlen_workspace_bytes(b, h, h, n, n)
            varlen_workspace = torch.empty(max(varlen_bytes, 1), dtype=torch.uint8, device="cuda")
            runs[f"{preset} varlen C call alone"] = (
                varlen_c_call(attention, *packed, cu_seqlens, n, varlen_out, varlen_workspace), None)
    # What a call is made of elsewhere: one launch through PyTorch, and the two allocations a sageattn call makes.
    tiny = torch.zeros(1, device="cuda")
    runs["torch: one tiny kernel (add_)"] = (lambda: tiny.add_(1.0), None)
    runs["torch: two empty() (out, workspace)"] = (
        lambda: (torch.empty(q.shape, dtype=q.dtype, device=q.device),
                 torch.empty(1 << 20, dtype=torch.uint8, device=q.device)), None)

    print(f"# {torch.cuda.get_device_name()}  shape b,h,N,d = {args.shape}, f16; microseconds per call "
          f"(wall time of {args.calls} back-to-back calls, median of {args.rounds}); sagegen from "
          f"{os.path.dirname(os.path.abspath(sagegen.__file__))}, library {sagegen._library.library()._name}")
    for name, (run, context) in runs.items():
        print(f"{name:<40} {per_call_us(run, args.calls, args.rounds, context):8.1f}", flush=True)
    preset = args.presets.split(",")[0]
    for wanted, run in ((args.profile, lambda: sagegen.sageattn(q, k, v, preset=preset)),
                        (args.profile_varlen,
                         lambda: sagegen.sageattn_varlen(*packed, cu_seqlens, cu_seqlens, n, n, preset=preset))):
        if not wanted:
            continue
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls):
            run()
        torch.cuda.synchronize()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
