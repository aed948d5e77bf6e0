"""--balance-data: spread a rollout's tokens evenly over the data-parallel ranks (slime's option).

Every rank trains the same number of samples per step, so the partition has equal sizes; what is
balanced is the token count (the training cost) each rank gets over the rollout. As in slime,
the responses of one prompt may then land in different optimizer steps.
"""

from __future__ import annotations

import heapq


def balanced_partitions(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices of `lengths` split into `parts` lists of equal size (len(lengths) must divide) with
    token sums as even as a greedy largest-first assignment makes them (within 4/3 of the best)."""
    if parts < 1 or len(lengths) % parts:
        raise ValueError(f"{len(lengths)} samples do not split into {parts} equal parts")
    size = len(lengths) // parts
    out: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, p) for p in range(parts)]  # (tokens so far, part) of the parts that still have room
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        total, p = heapq.heappop(heap)
        out[p].append(i)
        if len(out[p]) < size:
            heapq.heappush(heap, (total + lengths[i], p))
    return [sorted(part) for part in out]


def balanced_order(lengths: list[int], ranks: int, per_rank_step: int) -> list[int]:
    """A reordering of the rollout such that slicing each global batch of `ranks * per_rank_step`
    samples rank by rank gives each rank its balanced part, step after step."""
    if ranks == 1:
        return list(range(len(lengths)))
    parts = balanced_partitions(lengths, ranks)
    order: list[int] = []
    for start in range(0, len(parts[0]), per_rank_step):
        for part in parts:
            order += part[start : start + per_rank_step]
    return order
