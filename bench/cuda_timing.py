"""CUDA-event timing shared by the benchmark scripts."""

import statistics

import torch


def time_ms(function, warmup=3, repeats=15):
    """Median of `repeats` timed calls (CUDA events), after `warmup` calls."""
    for _ in range(warmup):
        function()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)
