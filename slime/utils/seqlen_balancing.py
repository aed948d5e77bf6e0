"""--balance-data: spread a rollout's tokens evenly over the data-parallel ranks (slime's option).

Every rank trains the same number of samples per step, so the partition has equal sizes; what is
balanced is the token count (the training cost) each rank gets over the rollout. As in slime,
the responses of one prompt may then land in different optimizer steps.
"""

from __future__ import annotations

import copy
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


# ---------------------------------------------------------------------------------------------
# slime's (verl's) partitioning helpers, with their results: the same partitions for the same input,
# ties included, so a slime hook that balances its batches with them sees the batches it expects.


class _Part:
    """One partition being built: its (index, length) items in the order they joined, and their sum."""

    __slots__ = ("items", "total")

    def __init__(self, items: list[tuple[int, int]] | None = None):
        self.items = list(items or [])
        self.total = sum(length for _, length in self.items)

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        # the order slime sorts partitions by: sum, then item count, then the items themselves
        return (self.total, len(self.items), self.items)

    def absorb(self, other: _Part) -> None:
        self.items.extend(other.items)
        self.total += other.total


class _KKState:
    """A k-way partial solution of the differencing method: k parts, kept largest sum first."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[_Part]):
        self.parts = sorted(parts, key=_Part.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.parts[0].total - self.parts[-1].total

    def __lt__(self, other: _KKState) -> bool:
        # heapq pops the smallest: the largest spread comes out first, then the larger top part
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.parts[0].key() < self.parts[0].key()

    def combine(self, other: _KKState) -> None:
        """Pair this state's largest part with the other's smallest, and so on down (differencing)."""
        k = len(self.parts)
        for i in range(k):
            self.parts[i].absorb(other.parts[k - 1 - i])
        self.parts = sorted(self.parts, key=_Part.key, reverse=True)


def _check_equal_split(n: int, k_partitions: int) -> None:
    if k_partitions < 1 or n % k_partitions:
        raise ValueError(f"{n} items do not split into {k_partitions} partitions of equal size")


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool):
    """slime's `karmarkar_karp`: the largest differencing method (Karmarkar-Karp) for k-way
    partitioning. Returns `k_partitions` lists of indices into `seqlen_list`, largest sum first.

    Every item starts as a k-way state (`equal_size`: the sorted items taken k at a time, one per
    part, so every part ends with len/k items); the two states of largest spread are merged,
    largest part with smallest, until one is left."""
    k = k_partitions
    ordered = sorted((length, i) for i, length in enumerate(seqlen_list))
    heap: list[_KKState] = []
    if equal_size:
        _check_equal_split(len(seqlen_list), k)
        for start in range(0, len(ordered), k):
            chunk = ordered[start : start + k]
            heapq.heappush(heap, _KKState([_Part([(i, length)]) for length, i in chunk]))
    else:
        for length, i in ordered:
            heapq.heappush(heap, _KKState([_Part([(i, length)])] + [_Part() for _ in range(k - 1)]))
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        first = heapq.heappop(heap)
        first.combine(heapq.heappop(heap))
        heapq.heappush(heap, first)
    return [[i for i, _ in part.items] for part in heap[0].parts]


def greedy_partition(seqlen_list: list[int], k_partitions: int, equal_size: bool):
    """slime's `greedy_partition`: each item in input order goes to the partition with the smallest
    sum so far (the first such on ties). With `equal_size` the item count decides first (each
    length is weighted by more than the whole sum), so every partition gets len/k items."""
    if equal_size:
        _check_equal_split(len(seqlen_list), k_partitions)
    weight = sum(seqlen_list) + 1 if equal_size else 0
    partitions: list[list[int]] = [[] for _ in range(k_partitions)]
    sums = [0] * k_partitions
    for i, length in enumerate(seqlen_list):
        target = min(range(k_partitions), key=sums.__getitem__)  # min keeps the first of equal sums
        partitions[target].append(i)
        sums[target] += length + weight
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool):
    """slime's `get_seqlen_balanced_partitions`: `karmarkar_karp`'s partitions, each sorted by
    index; it refuses fewer items than partitions, and any empty partition."""
    if len(seqlen_list) < k_partitions:
        raise ValueError(f"{len(seqlen_list)} items cannot fill {k_partitions} partitions")
    partitions = karmarkar_karp(seqlen_list=seqlen_list, k_partitions=k_partitions, equal_size=equal_size)
    if len(partitions) != k_partitions:
        raise ValueError(f"{len(partitions)} partitions made, {k_partitions} asked for")
    for n, part in enumerate(partitions):
        if not part:
            raise ValueError(f"partition {n} is empty")
    if sorted(i for part in partitions for i in part) != list(range(len(seqlen_list))):
        raise ValueError("the partitions do not hold every index exactly once")
    return [sorted(part) for part in partitions]


def first_fit_pack(total_lengths, max_tokens_per_bin):
    """slime's `first_fit_pack`: first-fit bin packing of `total_lengths` (in order) into bins of
    at most `max_tokens_per_bin` tokens; returns the bins as lists of indices. A length over the
    limit gets a bin of its own."""
    bins: list[list[int]] = []
    sums: list[int] = []
    for i, length in enumerate(total_lengths):
        for b, total in enumerate(sums):
            if total + length <= max_tokens_per_bin:
                bins[b].append(i)
                sums[b] += length
                break
        else:
            bins.append([i])
            sums.append(length)
    return bins


def _halve_by_tokens(indices: list[int], lengths) -> list[list[int]]:
    """Two halves of one bin, longest item first into the lighter half (the first on a tie)."""
    halves: list[list[int]] = [[], []]
    sums = [0, 0]
    for i in sorted(indices, key=lambda i: -lengths[i]):
        side = 0 if sums[0] <= sums[1] else 1
        halves[side].append(i)
        sums[side] += lengths[i]
    return halves


def expand_bins_by_splitting(bins: list[list[int]], target_count: int, lengths) -> None:
    """slime's `expand_bins_by_splitting`: in place, split the heaviest bin that holds more than
    one index (the last such on equal sums) into two token-balanced halves, the second appended,
    until there are `target_count` bins or only single-index bins are left. No bin ever grows."""
    while len(bins) < target_count:
        splittable = [(sum(lengths[i] for i in b), n) for n, b in enumerate(bins) if len(b) > 1]
        if not splittable:
            return
        _, n = max(splittable)
        bins[n], second = _halve_by_tokens(bins[n], lengths)
        bins.append(second)


def get_reverse_idx(idx_map):
    """slime's `get_reverse_idx`: the inverse permutation of `idx_map` (same container type, a
    copy): `out[idx_map[i]] == i`."""
    reverse = copy.deepcopy(idx_map)
    for position, idx in enumerate(idx_map):
        reverse[idx] = position
    return reverse
