"""--balance-data's partition against a brute-force optimum, and the order the ranks slice."""

from __future__ import annotations

import itertools
import random

import pytest

from slime.utils.seqlen_balancing import balanced_order, balanced_partitions


def _best_max_sum(lengths: list[int], parts: int) -> int:
    """The smallest possible largest part, over every equal-size partition (tiny inputs only)."""
    n, size = len(lengths), len(lengths) // parts
    best = sum(lengths)

    def rec(left: list[int], sums: list[int]) -> None:
        nonlocal best
        if not left:
            best = min(best, max(sums))
            return
        first, rest = left[0], left[1:]
        for combo in itertools.combinations(rest, size - 1):
            group = (first, *combo)
            rec([i for i in rest if i not in combo], sums + [sum(lengths[i] for i in group)])

    rec(list(range(n)), [])
    return best


@pytest.mark.parametrize("seed", range(20))
def test_partition_is_equal_sized_complete_and_near_the_optimum(seed):
    rng = random.Random(seed)
    parts = rng.choice([2, 3])
    lengths = [rng.randint(1, 500) for _ in range(parts * rng.randint(2, 3))]
    out = balanced_partitions(lengths, parts)
    assert sorted(i for p in out for i in p) == list(range(len(lengths)))
    assert {len(p) for p in out} == {len(lengths) // parts}
    assert max(sum(lengths[i] for i in p) for p in out) <= 4 / 3 * _best_max_sum(lengths, parts) + 1e-9


def test_balancing_beats_the_plain_slices_on_skewed_lengths():
    lengths = [1000, 900, 800, 700, 10, 20, 30, 40]  # plain slices: 3400 tokens vs 100
    parts = balanced_partitions(lengths, 2)
    assert [sum(lengths[i] for i in p) for p in parts] == [1750, 1750]


def test_order_gives_each_rank_its_part_step_by_step():
    lengths = [50, 1, 40, 2, 30, 3, 20, 4]
    order = balanced_order(lengths, ranks=2, per_rank_step=2)
    parts = balanced_partitions(lengths, 2)
    assert sorted(order) == list(range(8))
    # global batch k = [rank 0's 2 samples, rank 1's 2 samples]
    assert order[0:2] + order[4:6] == parts[0] and order[2:4] + order[6:8] == parts[1]
    assert balanced_order(lengths, ranks=1, per_rank_step=4) == list(range(8))
    with pytest.raises(ValueError, match="do not split"):
        balanced_partitions([1, 2, 3], 2)
