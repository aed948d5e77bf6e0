"""CPU cores as the placement's unit: on a machine without GPUs a slime "GPU" is a set of cores.

`split_cores` divides a node's cores among the processes that share them; `pin_to_cores` binds the
calling process (and every process it starts later: the affinity is inherited) to its share.
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def node_cores() -> list[int]:
    """The cores this process may run on (its affinity), sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def split_cores(cores: Sequence[int], weights: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Contiguous, disjoint shares of `cores`, share i in proportion to `weights[i]` (slots), or None
    when there are fewer cores than slots (the processes then share all the cores, unpinned)."""
    cores = sorted(cores)
    total = sum(weights)
    if total == 0:
        return []
    if total > len(cores):
        return None
    shares, slot = [], 0
    for w in weights:
        lo, hi = slot * len(cores) // total, (slot + w) * len(cores) // total
        shares.append(tuple(cores[lo:hi]))
        slot += w
    return shares


def pin_to_cores(cores: Sequence[int] | None) -> tuple[int, ...]:
    """Bind this process, every thread it has already started included (a Ray worker has several),
    to `cores` (None: leave it as it is); return the cores it may now use."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
        try:
            threads = os.listdir("/proc/self/task")
        except OSError:
            threads = []
        for tid in threads:
            try:
                os.sched_setaffinity(int(tid), set(cores))
            except OSError:  # the thread ended meanwhile
                pass
    return tuple(node_cores())


def format_cores(cores: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    cores = sorted(cores)
    parts, i = [], 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)
