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
    return [xs[i:i + g] for i in range(0, len(xs), g)]


def _reference(estimator: str, std: bool, normalize: bool) -> list[float]:
    if not normalize or estimator in ("ppo", "reinforce_plus_plus"):
        return list(REWARDS)
    out = []
    for grp in _groups(REWARDS):
        mean = sum(grp) / len(grp)
        for i, r in enumerate(grp):
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
    args = make_args("--advantage-estimator", estimator, "--n-samples-per-prompt", "4", "--rollout-batch-size", "3",
                     *flags)
    assert args.grpo_std_normalization == ("--disable-grpo-std-normalization" not in flags)
    assert args.rewards_normalization == ("--disable-rewards-normalization" not in flags)
    raw, rewards = post_process_rewards(args, _samples())
    assert raw == REWARDS
    assert rewards == pytest.approx(_reference(estimator, args.grpo_std_normalization, args.rewards_normalization),
                                    abs=1e-6)
