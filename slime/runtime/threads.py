"""CPU thread budgeting.

Measured on the 2-core target machine: oversubscribing cores makes torch ~30x slower, and
OpenMP spin-waiting hurts processes that take turns on the same cores. Every process that
runs torch calls `configure_torch_threads` first.
"""

from __future__ import annotations

import os

import torch


def thread_env(num_threads: int) -> dict[str, str]:
    """Environment for a child process that should use `num_threads` threads."""
    n = str(max(1, int(num_threads)))
    return {
        "OMP_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "OPENBLAS_NUM_THREADS": n,
        # Passive waiting: a process that is idle while another computes must not spin.
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
    }


def configure_torch_threads(num_threads: int) -> None:
    """Set this process's torch thread counts (call before heavy torch work)."""
    os.environ.update(thread_env(num_threads))
    torch.set_num_threads(max(1, int(num_threads)))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set once in this process
        pass


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
