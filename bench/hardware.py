"""What every benchmark prints first: the date and the CPU it ran on (model, cores, and the flags
that decide bf16 speed: AVX-512, AVX512-BF16, AMX). Figures are comparable only within one run on
one CPU; the docs keep one table per kind of CPU."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

from slime.runtime.c_library import cpu_info

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_line() -> str:
    info = cpu_info()
    flags = set(info.get("flags", "").split())
    marks = [f for f in FLAGS if f in flags]
    model = info.get("model name") or platform.processor() or "unknown CPU"
    return f"{model}, {os.cpu_count()} cores, flags: {' '.join(marks) or 'none of ' + '/'.join(FLAGS)}"


def header() -> str:
    """`YYYY-MM-DD; <cpu_line>` for a benchmark's first line."""
    return f"{time.strftime('%Y-%m-%d')}; {cpu_line()}"


def matmul_gflops(dtype: Any, threads: int, size: int = 1024, seconds: float = 0.5, windows: int = 6) -> float:
    """torch.mm's GFLOP/s in `dtype` on `threads` threads: the best of several short windows, what
    the cores can do when nothing else disturbs them (neighbours on a shared machine make single
    readings swing by 2x), so a roofline built on it is not flattered."""
    import torch

    torch.set_num_threads(threads)
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    for _ in range(3):
        torch.mm(a, b)
    best = 0.0
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, b)
            n += 1
        best = max(best, 2 * size**3 * n / (time.perf_counter() - t0) / 1e9)
    return best
