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

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "group_normalize_rewards",
    "drop_thin_groups",
    "rloo_rewards",
    "expand_to_tokens",
    "reinforce_plus_plus_returns",
    "reinforce_plus_plus_baseline_advantages",
    "ppo_token_rewards",
    "gae_advantages_and_returns",
    "masked_whiten",
    "opd_penalize_advantages",
    "dapo_overlong_penalty",
]


def group_normalize_rewards(
    rewards: Tensor | Sequence[float],
    group_size: int,
    std_normalization: bool = True,
    eps: float = 1e-6,
    valid: Tensor | Sequence[bool] | None = None,
) -> Tensor:
    """GRPO advantages, one per sample, groups are consecutive runs of ``group_size`` samples.

    ``A_i = (r_i - mean_g) / (std_g + eps)`` with ``std_g = sqrt(sum_j (r_j - mean_g)^2 / (G - 1))``
    (unbiased, as slime's ``torch.std``); ``std_normalization=False`` gives Dr.GRPO's ``r_i - mean_g``.
    Groups of one and groups of equal rewards get exactly 0 (never NaN).

    ``valid`` (one bool per sample): the group statistics are taken over the valid samples only
    (``G`` is then the group's number of valid samples); an invalid sample (a FAILED one, whose
    reward is no reward) gets 0 and leaves its group's mean and std untouched.

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
    v = _valid_mask(valid, n)
    if v is not None and not bool(v.all()):
        return _normalize_valid(r.view(-1, group_size), v.view(-1, group_size), std_normalization, eps).reshape(n)
    groups = r.view(-1, group_size)
    centered = groups - groups.mean(dim=-1, keepdim=True)
    if std_normalization:
        if group_size == 1:
            std = torch.zeros_like(centered)
        else:
            std = groups.std(dim=-1, unbiased=True, keepdim=True)
        centered = centered / (std + eps)
    return centered.reshape(n)


def _valid_mask(valid: Tensor | Sequence[bool] | None, n: int) -> Tensor | None:
    if valid is None:
        return None
    v = torch.as_tensor(valid).to(torch.bool)
    if v.shape != (n,):
        raise ValueError(f"valid must have one entry per reward ({n}), got shape {tuple(v.shape)}")
    return v


def _normalize_valid(groups: Tensor, valid: Tensor, std_normalization: bool, eps: float) -> Tensor:
    """``group_normalize_rewards`` over each group's valid members; invalid members get 0."""
    w = valid.to(groups.dtype)
    k = w.sum(dim=-1, keepdim=True)
    mean = (groups * w).sum(dim=-1, keepdim=True) / k.clamp_min(1)
    centered = torch.where(valid, groups - mean, torch.zeros_like(groups))
    if std_normalization:
        var = (centered * centered).sum(dim=-1, keepdim=True) / (k - 1).clamp_min(1)
        std = torch.where(k > 1, var.sqrt(), torch.zeros_like(var))
        centered = centered / (std + eps)
    return centered


def drop_thin_groups(valid: Tensor | Sequence[bool], group_size: int, min_valid: int = 2) -> tuple[Tensor, int]:
    """Groups with fewer than ``min_valid`` valid samples leave the batch whole: returns the valid
    mask with such groups all False, and how many groups were dropped.
    (A group statistic needs two values: the unbiased std, RLOO's leave-one-out mean; one valid
    sample alone would only get advantage 0.)"""
    v = torch.as_tensor(valid).to(torch.bool)
    if v.numel() % group_size != 0:
        raise ValueError(f"{v.numel()} samples are not a whole number of groups of {group_size}")
    per_group = v.view(-1, group_size)
    thin = per_group.sum(dim=-1) < min_valid
    kept = per_group & ~thin.unsqueeze(-1)
    return kept.reshape(-1), int(thin.sum())


def expand_to_tokens(sample_advantages: Tensor | Sequence[float], response_lengths: Sequence[int]) -> list[Tensor]:
    """Per-token advantages: sample ``i``'s scalar repeated ``response_lengths[i]`` times (GRPO returns)."""
    adv = torch.as_tensor(sample_advantages)
    if adv.dim() != 1:
        raise ValueError(f"sample_advantages must be 1-D [N], got shape {tuple(adv.shape)}")
    if adv.shape[0] != len(response_lengths):
        raise ValueError(f"{adv.shape[0]} sample advantages but {len(response_lengths)} response lengths")
    lengths = [int(n) for n in response_lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"response length must be >= 0, got {min(lengths)}")
    # one repeat and one split: views of a single tensor, not one tensor op per sample
    return list(torch.repeat_interleave(adv, torch.as_tensor(lengths, dtype=torch.long)).split(lengths))


def rloo_rewards(
    rewards: Tensor | Sequence[float], group_size: int, valid: Tensor | Sequence[bool] | None = None
) -> Tensor:
    """RLOO (https://arxiv.org/abs/2402.14740): ``A_i = r_i - mean_{j != i} r_j`` within each group.

    Equals ``(r_i - mean_g) * G / (G - 1)``; a group of one has no baseline and gets 0. With
    ``valid``, ``j`` runs over the group's valid samples only (``G`` their number) and an invalid
    sample gets 0.
    """
    centered = group_normalize_rewards(rewards, group_size, std_normalization=False, valid=valid)
    if group_size == 1:
        return torch.zeros_like(centered)
    v = _valid_mask(valid, centered.shape[0])
    if v is None or bool(v.all()):
        return centered * (group_size / (group_size - 1))
    k = v.view(-1, group_size).sum(dim=-1, keepdim=True).to(centered.dtype)
    scale = torch.where(k > 1, k / (k - 1).clamp_min(1), torch.zeros_like(k))
    return (centered.view(-1, group_size) * scale).reshape(-1)


def _last_trained_index(mask: Tensor | Sequence[int]) -> int | None:
    idx = torch.nonzero(torch.as_tensor(mask).to(torch.bool), as_tuple=True)[0]
    return int(idx[-1]) if idx.numel() else None


def reinforce_plus_plus_returns(
    rewards: Sequence[float],
    kl: Sequence[Tensor],
    loss_masks: Sequence[Tensor | Sequence[int]],
    kl_coef: float,
    gamma: float,
) -> list[Tensor]:
    """REINFORCE++ (https://arxiv.org/abs/2501.03262) returns, one tensor per sample.

    Token rewards ``r_t = -kl_coef * kl_t``, plus the sample's reward on its last *trained* token;
    ``G_t = r_t + gamma * G_{t+1}``. A fully masked sample (never trained on) gets only the KL part.
    """
    out = []
    for reward, kl_i, mask in zip(rewards, kl, loss_masks, strict=True):
        token_rewards = -kl_coef * kl_i.to(torch.float32).clone()
        last = _last_trained_index(mask)
        if last is not None:
            token_rewards[last] += float(reward)
        returns = torch.zeros_like(token_rewards)
        running: Tensor | float = 0.0
        for t in range(token_rewards.shape[0] - 1, -1, -1):
            running = token_rewards[t] + gamma * running
            returns[t] = running
        out.append(returns)
    return out


def reinforce_plus_plus_baseline_advantages(
    rewards: Sequence[float], kl: Sequence[Tensor], kl_coef: float
) -> list[Tensor]:
    """REINFORCE++-baseline: the (group-mean-subtracted) reward on every token, minus ``kl_coef * kl_t``."""
    return [float(r) - kl_coef * kl_i.to(torch.float32) for r, kl_i in zip(rewards, kl, strict=True)]


def ppo_token_rewards(rewards: Sequence[float], kl: Sequence[Tensor], kl_coef: float) -> list[Tensor]:
    """PPO's per-token rewards (slime): ``-kl_coef * kl_t``, plus the reward on the last response token."""
    out = []
    for reward, kl_i in zip(rewards, kl, strict=True):
        r = -kl_coef * kl_i.to(torch.float32).clone()
        if r.numel():
            r[-1] += float(reward)
        out.append(r)
    return out


def gae_advantages_and_returns(
    token_rewards: Sequence[Tensor], values: Sequence[Tensor], gamma: float, lambd: float
) -> tuple[list[Tensor], list[Tensor]]:
    """Generalized advantage estimation per sample (value after the last token is 0).

    ``delta_t = r_t + gamma * V_{t+1} - V_t``, ``A_t = delta_t + gamma * lambd * A_{t+1}``,
    ``returns_t = A_t + V_t`` (the critic's regression target).
    """
    advantages, returns = [], []
    for r, v in zip(token_rewards, values, strict=True):
        r, v = r.to(torch.float32), v.detach().to(torch.float32)
        if r.shape != v.shape:
            raise ValueError(f"token rewards {tuple(r.shape)} and values {tuple(v.shape)} differ in shape")
        next_v = torch.cat([v[1:], v.new_zeros(1)]) if v.numel() else v
        deltas = r + gamma * next_v - v
        adv = torch.zeros_like(deltas)
        running: Tensor | float = 0.0
        for t in range(deltas.shape[0] - 1, -1, -1):
            running = deltas[t] + gamma * lambd * running
            adv[t] = running
        advantages.append(adv)
        returns.append(adv + v)
    return advantages, returns


def masked_whiten(
    values: Tensor,
    mask: Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    all_reduce_sum: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and *unbiased* variance over the unmasked entries.

    ``--normalize-advantages`` (slime's ``distributed_masked_whiten``): ``all_reduce_sum`` sums the
    statistics ``[sum, sum of squares, count]`` over data-parallel ranks, so every rank whitens with
    the global statistics. With ``shift_mean=False`` the mean is added back. No unmasked entry: the
    values are returned unchanged (nothing is trained on them).
    """
    m = mask.to(torch.float64)
    x = values.to(torch.float64)
    stats = torch.stack([(x * m).sum(), (x * x * m).sum(), m.sum()])
    if all_reduce_sum is not None:
        stats = all_reduce_sum(stats)
    total, total_sq, count = (float(v) for v in stats)
    if count == 0:
        return values.clone()
    mean = total / count
    var = total_sq / count - mean * mean
    if count >= 2:
        var = var * count / (count - 1)
    var = max(var, 0.0)
    out = (x - mean) / (var + eps) ** 0.5
    if not shift_mean:
        out = out + mean
    return out.to(values.dtype)


def opd_penalize_advantages(
    advantages: Sequence[Tensor],
    student_log_probs: Sequence[Tensor],
    teacher_log_probs: Sequence[Tensor],
    opd_kl_coef: float,
) -> tuple[list[Tensor], list[Tensor]]:
    """On-policy distillation (slime's OPD): ``A_t - opd_kl_coef * (log pi_student - log pi_teacher)``.

    The per-token reverse-KL estimate pulls the policy toward the teacher on the tokens it sampled;
    it is orthogonal to the advantage estimator. Returns ``(advantages, reverse_kl)``.
    """
    new_adv, reverse_kl = [], []
    for a, s, t in zip(advantages, student_log_probs, teacher_log_probs, strict=True):
        rk = s.detach().to(torch.float32) - torch.as_tensor(t, dtype=torch.float32)
        new_adv.append(a - opd_kl_coef * rk)
        reverse_kl.append(rk)
    return new_adv, reverse_kl


def dapo_overlong_penalty(
    response_lengths: Sequence[int], max_response_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> list[float]:
    """DAPO's soft overlong punishment (https://arxiv.org/abs/2503.14476), added to the reward.

    With ``L_exp = max_response_len - buffer_len``: 0 for ``|y| <= L_exp``,
    ``(L_exp - |y|) / buffer_len * penalty_factor`` inside the buffer, ``-penalty_factor`` beyond
    ``max_response_len``.
    """
    if buffer_len < 1 or buffer_len > max_response_len:
        raise ValueError(f"buffer_len must be in [1, max_response_len={max_response_len}], got {buffer_len}")
    expected = max_response_len - buffer_len
    out = []
    for n in response_lengths:
        exceed = int(n) - expected
        out.append(0.0 if exceed <= 0 else -min(exceed / buffer_len, 1.0) * penalty_factor)
    return out
