"""slime's `slime.observability.metric_utils`: the small metric helpers hook code calls (pass@k,
summary statistics, the repetition check, the step a rollout's metrics are logged at).

Self-contained here (numpy and the standard library's compressors); the rollout pipeline's own
pass@k lives in slime.rollout.train_data and agrees with `compute_pass_rate`.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import zlib
from argparse import Namespace
from typing import Any, Literal

import numpy as np

__all__ = [
    "dict_add_prefix",
    "compute_pass_rate",
    "compute_statistics",
    "compression_ratio",
    "has_repetition",
    "compute_rollout_step",
]

# a response whose last 10000 characters compress more than 10x is counted as repeating (slime's rule)
REPETITION_WINDOW = 10000
REPETITION_RATIO = 10


def dict_add_prefix(d: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`{prefix + key: value}` for every item."""
    return {f"{prefix}{k}": v for k, v in d.items()}


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem: 1 - C(n - c, k) / C(n, k), as a running product."""
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def compute_pass_rate(flat_rewards: list[float], group_size: int, num_groups: int | None = None) -> dict[str, float]:
    """`{"pass@1": .., "pass@2": .., ...}` for k = 1, 2, 4, ... up to `group_size`, averaged over
    the groups of `group_size` consecutive rewards; a reward of exactly 1 is correct. Empty for a
    group size of 1."""
    if group_size == 1:
        return {}
    if num_groups is None:
        num_groups = len(flat_rewards) // group_size
    if len(flat_rewards) != num_groups * group_size:
        raise ValueError(f"{len(flat_rewards)} rewards are not {num_groups} groups of {group_size}")
    correct = (np.asarray(flat_rewards).reshape(num_groups, group_size) == 1).sum(axis=1)
    out = {}
    for k in (2**i for i in range(int(math.log2(group_size)) + 1)):
        out[f"pass@{k}"] = float(np.mean([_pass_at_k(group_size, int(c), k) for c in correct]))
    return out


def compute_statistics(values: list[float]) -> dict[str, float]:
    """mean, median, max and min of the values."""
    arr = np.asarray(values)
    return {
        "mean": np.mean(arr).item(),
        "median": np.median(arr).item(),
        "max": np.max(arr).item(),
        "min": np.min(arr).item(),
    }


_COMPRESSORS = {
    "zlib": lambda raw, level: zlib.compress(raw, level),
    "gzip": lambda raw, level: gzip.compress(raw, compresslevel=level),
    "bz2": lambda raw, level: bz2.compress(raw, compresslevel=level),
    "lzma": lambda raw, level: lzma.compress(raw, preset=level),
}


def compression_ratio(
    data: str | bytes,
    *,
    encoding: str = "utf-8",
    algorithm: Literal["zlib", "gzip", "bz2", "lzma"] = "zlib",
    level: int = 9,
) -> tuple[float, float]:
    """(original size / compressed size, percent saved). Empty input: (inf, 0.0)."""
    raw = data.encode(encoding) if isinstance(data, str) else data
    if algorithm not in _COMPRESSORS:
        raise ValueError(f"Unsupported algorithm: {algorithm}")
    if not raw:
        return float("inf"), 0.0
    size = len(_COMPRESSORS[algorithm](raw, level))
    if size == 0:
        return float("inf"), 100.0
    return len(raw) / size, 100.0 * (1.0 - size / len(raw))


def has_repetition(text: str) -> bool:
    """A long text (over 10000 characters) whose tail compresses more than 10x."""
    return len(text) > REPETITION_WINDOW and compression_ratio(text[-REPETITION_WINDOW:])[0] > REPETITION_RATIO


def compute_rollout_step(args: Namespace, rollout_id: int) -> int:
    """The step a rollout's metrics are logged at: the rollout id, or with
    `--wandb-always-use-train-step` the optimizer steps done before it."""
    if args.wandb_always_use_train_step:
        return rollout_id * args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
    return rollout_id
