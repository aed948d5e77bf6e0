"""The rollout side's reward step under slime's flags, each case against a plain loop written here:
`--disable-grpo-std-normalization` (dest grpo_std_normalization) and
`--disable-rewards-normalization` (dest rewards_normalization), as slime names them."""

from __future__ import annotations

import statistics

import pytest

from slime.rollout.train_data import post_process_rewards
from slime.utils.types import Sample
from tests.helpers import make_args

REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 1.0]  # 3 groups of 4


def _samples() -> list[Sample]:
    return [Sample(reward=r, status=Sample.Status.COMPLETED, response_length=3, index=i) for i, r in enumerate(REWARDS)]


def _groups(xs: list[float], g: int = 4) -> list[list[float]]:
    return [xs[i : i + g] for i in range(0, len(xs), g)]


def _reference(estimator: str, std: bool, normalize: bool) -> list[float]:
    if not normalize or estimator in ("ppo", "reinforce_plus_plus"):
        return list(REWARDS)
    out = []
    for grp in _groups(REWARDS):
        mean = sum(grp) / len(grp)
        for r in grp:
            if estimator == "rloo":
                out.append(r - (sum(grp) - r) / (len(grp) - 1))
            elif estimator in ("grpo", "gspo") and std:
                out.append((r - mean) / (statistics.stdev(grp) + 1e-6))
            else:
                out.append(r - mean)
    return out


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "rloo", "reinforce_plus_plus_baseline", "reinforce_plus_plus"])
@pytest.mark.parametrize("flags", [[], ["--disable-grpo-std-normalization"], ["--disable-rewards-normalization"]])
def test_group_normalisation_follows_slimes_flags(estimator, flags):
    args = make_args(
        "--advantage-estimator", estimator, "--n-samples-per-prompt", "4", "--rollout-batch-size", "3", *flags
    )
    assert args.grpo_std_normalization == ("--disable-grpo-std-normalization" not in flags)
    assert args.rewards_normalization == ("--disable-rewards-normalization" not in flags)
    raw, rewards = post_process_rewards(args, _samples())
    assert raw == REWARDS
    assert rewards == pytest.approx(
        _reference(estimator, args.grpo_std_normalization, args.rewards_normalization), abs=1e-6
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_a_group_with_extra_samples_is_normalised_on_its_own(estimator):
    """An agent session split into segments gives its group more than n samples (one group of 5 here,
    n = 4): each prompt group is normalised over its own samples, as newer slime does (before: 'number
    of rewards (13) is not a multiple of group_size (4)'). A FAILED sample stays out of its group."""
    from slime.rollout.train_data import prompt_group_sizes, statistics_mask

    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0, 1.0]
    groups = [0] * 4 + [1] * 5 + [2] * 4
    samples = [
        Sample(reward=r, status=Sample.Status.COMPLETED, response_length=3, index=i, group_index=gi)
        for i, (r, gi) in enumerate(zip(rewards, groups, strict=True))
    ]
    samples[2].status = Sample.Status.FAILED
    args = make_args("--advantage-estimator", estimator, "--n-samples-per-prompt", "4", "--rollout-batch-size", "3")
    assert prompt_group_sizes(samples, 4) == [4, 5, 4]
    valid, dropped = statistics_mask(args, samples)
    assert valid == [True, True, False] + [True] * 10 and dropped == 0
    _, got = post_process_rewards(args, samples)
    expected = []
    for lo, hi in ((0, 4), (4, 9), (9, 13)):
        grp = [(rewards[i], valid[i]) for i in range(lo, hi)]
        ok = [r for r, v in grp if v]
        mean = sum(ok) / len(ok)
        for r, v in grp:
            if not v:
                expected.append(0.0)
            elif estimator == "rloo":
                expected.append(r - (sum(ok) - r) / (len(ok) - 1))
            else:
                expected.append((r - mean) / (statistics.stdev(ok) + 1e-6))
    assert got == pytest.approx(expected, abs=1e-6)
    # groups of exactly n: the sizes are not needed (the uniform path), whatever the indices
    assert prompt_group_sizes(samples[:4] + samples[9:], 4) is None
