"""Stock dynamic-sampling filters (slime's names)."""

from __future__ import annotations

import statistics

from slime.rollout.filter_hub.base_types import DynamicFilterOutput

__all__ = ["check_reward_nonzero_std", "check_reward_nonzero_std_with_fallback"]


def check_reward_nonzero_std(args, samples, **kwargs) -> DynamicFilterOutput:
    """Keep a group only if its rewards are not all equal (DAPO's dynamic sampling): a group whose
    samples all score the same gives GRPO no advantage."""
    rewards = [(s[0] if isinstance(s, list) else s).get_reward_value(args) for s in samples]
    keep = len(rewards) > 1 and statistics.stdev(rewards) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def check_reward_nonzero_std_with_fallback(args, samples, **kwargs) -> DynamicFilterOutput:
    """As `check_reward_nonzero_std`, but a zero-std group is kept when dropping it would mean
    sampling more prompts to fill the batch (prefer informative groups, never pay another round)."""
    output = check_reward_nonzero_std(args, samples, **kwargs)
    output.keep_when_insufficient = True
    return output
