"""Sample-level advantages (GRPO / Dr.GRPO group normalization) and their token expansion.

slime's GRPO normalization (``RolloutManager._post_process_rewards``) reshapes the rewards to
``[n_prompts, n_samples_per_prompt]``, subtracts the group mean, and, with
``--grpo-std-normalization`` (default on), divides by ``rewards.std(dim=-1, keepdim=True) + 1e-6``.
``torch.Tensor.std`` defaults to the *unbiased* estimator (Bessel's correction, divisor
``G - 1``), so slime's std is the sample std, not the population std; we match it.

Where we differ from slime on purpose:

* a group of one sample gets advantage 0 (the unbiased std of one value is NaN in torch, which
  would turn slime's ``0 / (nan + 1e-6)`` into NaN);
* a batch whose size is not a multiple of ``group_size`` raises ``ValueError`` (slime silently
  falls back to treating the whole batch as one group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["group_normalize_rewards", "expand_to_tokens"]


def group_normalize_rewards(
    rewards: Tensor | Sequence[float],
    group_size: int,
    std_normalization: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages, one per sample, groups are consecutive runs of ``group_size`` samples.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``std_g = sqrt(sum_j (r_j - mean_g)^2 / (G - 1))``
    (unbiased, as slime's ``torch.std``); ``std_normalization=False`` gives Dr.GRPO's ``r_i - mean_g``.
    Groups of one and groups of equal rewards get exactly 0 (never NaN).

    Returns a float tensor of shape ``[N]`` (float32 unless ``rewards`` is float64).
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    r = torch.as_tensor(rewards)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(r.shape)}")
    if not r.is_floating_point() or r.dtype in (torch.float16, torch.bfloat16):
        r = r.to(torch.float32)
    n = r.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"number of rewards ({n}) is not a multiple of group_size ({group_size}) "
            f"(n_samples_per_prompt): every prompt must have the same number of samples"
        )
    if n == 0:
        return r.clone()
    groups = r.view(-1, group_size)
    centered = groups - groups.mean(dim=-1, keepdim=True)
    if std_normalization:
        if group_size == 1:
            std = torch.zeros_like(centered)
        else:
            std = groups.std(dim=-1, unbiased=True, keepdim=True)
        centered = centered / (std + eps)
    return centered.reshape(n)


def expand_to_tokens(sample_advantages: Tensor | Sequence[float], response_lengths: Sequence[int]) -> list[Tensor]:
    """Per-token advantages: sample ``i``'s scalar repeated ``response_lengths[i]`` times (GRPO returns)."""
    adv = torch.as_tensor(sample_advantages)
    if adv.dim() != 1:
        raise ValueError(f"sample_advantages must be 1-D [N], got shape {tuple(adv.shape)}")
    if adv.shape[0] != len(response_lengths):
        raise ValueError(
            f"{adv.shape[0]} sample advantages but {len(response_lengths)} response lengths"
        )
    out = []
    for a, length in zip(adv, response_lengths):
        if int(length) < 0:
            raise ValueError(f"response length must be >= 0, got {length}")
        out.append(a.expand(int(length)).clone())
    return out
