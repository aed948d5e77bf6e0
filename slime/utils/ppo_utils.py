"""slime's `slime.utils.ppo_utils`, with slime's signatures and return shapes, on this repo's
implementations in slime.algorithms (kl.py, losses.py, advantages.py).

Without Megatron there is no context or tensor parallelism: `total_lengths` are accepted and
unused (each rank holds whole responses), and `calculate_log_probs_and_entropy` takes a
`tp_group` of None (or of one rank); a larger group raises SlimeError. The chunked scans
(`chunked_discounted_returns`, `chunked_gae`) give the same numbers as the plain recurrences,
which is what they compute here.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import torch
import torch.distributed as dist

from slime.algorithms.advantages import gae_advantages_and_returns, reinforce_plus_plus_returns
from slime.algorithms.kl import compute_approx_kl as _approx_kl
from slime.algorithms.losses import cispo_loss, compute_entropy, compute_log_probs, ppo_clip_from_kl
from slime.errors import SlimeError

__all__ = [
    "compute_approx_kl",
    "compute_opsm_mask",
    "compute_gspo_kl",
    "compute_policy_loss",
    "compute_cispo_loss",
    "get_grpo_returns",
    "get_reinforce_plus_plus_returns",
    "get_reinforce_plus_plus_baseline_advantages",
    "get_advantages_and_returns_batch",
    "vanilla_gae",
    "chunked_discounted_returns",
    "chunked_gae",
    "calculate_log_probs_and_entropy",
]


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_loss_type: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL estimate (k1, k2, k3, low_var_kl); slime.algorithms.kl.compute_approx_kl."""
    return _approx_kl(log_probs, log_probs_base, kl_loss_type, importance_ratio)


def _seq_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return ((old_log_prob - log_prob) * loss_mask).sum() / torch.clamp_min(loss_mask.sum(), 1)


def compute_opsm_mask(
    args: Namespace,
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    advantages: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Off-policy sequence masking (`--use-opsm`): `(mask, clipfrac)`, the mask 0 on the tokens
    with a negative advantage of each sample whose masked mean `old - new` exceeds
    `args.opsm_delta` (concatenated), clipfrac the sum over samples of masked tokens / trained tokens."""
    masks = []
    clipfrac = torch.tensor(0.0, device=advantages[0].device)
    for log_prob, old_log_prob, advantage, loss_mask in zip(
        full_log_probs, full_old_log_probs, advantages, loss_masks, strict=True
    ):
        drop = ((advantage < 0) & (_seq_kl(log_prob, old_log_prob, loss_mask) > args.opsm_delta)).float()
        clipfrac = clipfrac + drop.sum() / torch.clamp_min(loss_mask.sum(), 1)
        masks.append(1 - drop)
    return torch.cat(masks, dim=0), clipfrac


def compute_gspo_kl(
    full_log_probs: list[torch.Tensor],
    full_old_log_probs: list[torch.Tensor],
    local_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
) -> torch.Tensor:
    """GSPO's per-sequence KL (masked mean of `old - new`) on every token of the sample,
    shaped like `local_log_probs`, concatenated."""
    return torch.cat(
        [
            _seq_kl(log_prob, old, mask).expand_as(local)
            for log_prob, old, local, mask in zip(
                full_log_probs, full_old_log_probs, local_log_probs, loss_masks, strict=True
            )
        ],
        dim=0,
    )


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip per token from `ppo_kl = old - new`: `(pg_losses, clipfrac)`, dual clip with
    `eps_clip_c`; slime.algorithms.losses.ppo_clip_from_kl."""
    return ppo_clip_from_kl(ppo_kl, advantages, eps_clip, eps_clip_high, eps_clip_c)


def compute_cispo_loss(
    ppo_kl: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO per token: `(pg_losses, clipfrac)`; slime.algorithms.losses.cispo_loss."""
    return cispo_loss(ppo_kl, log_probs, advantages, eps_clip, eps_clip_high)


def get_grpo_returns(rewards: torch.Tensor, kl: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each sample's (normalized) reward on every token, shaped like its `kl`."""
    return [torch.ones_like(kl_i) * rewards[i] for i, kl_i in enumerate(kl)]


def get_reinforce_plus_plus_returns(
    rewards: torch.Tensor,
    kl: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    response_lengths: list[int],
    total_lengths: list[int],
    kl_coef: float,
    gamma: float,
) -> list[torch.Tensor]:
    """REINFORCE++ returns: token rewards `-kl_coef * kl * mask` plus the reward on the last
    trained token, discounted by `gamma`; slime.algorithms.advantages.reinforce_plus_plus_returns."""
    for i, mask in enumerate(loss_masks):
        if not torch.as_tensor(mask).sum().item() > 0:
            raise ValueError(f"Sequence at index {i} is fully masked.")
    masked_kl = [k * torch.as_tensor(m, dtype=k.dtype) for k, m in zip(kl, loss_masks, strict=True)]
    rewards_list = [float(r) for r in rewards]
    return reinforce_plus_plus_returns(rewards_list, masked_kl, loss_masks, kl_coef, gamma)


def get_reinforce_plus_plus_baseline_advantages(
    rewards: torch.Tensor, kl: list[torch.Tensor], loss_masks: list[torch.Tensor], kl_coef: float
) -> list[torch.Tensor]:
    """REINFORCE++-baseline: the baseline-subtracted reward on every token minus `kl_coef * kl`
    (unwhitened; `loss_masks` as slime's signature, unused there too)."""
    return [torch.ones_like(kl_i) * r - kl_coef * kl_i for kl_i, r in zip(kl, rewards, strict=True)]


def get_advantages_and_returns_batch(
    total_lengths: list[int],
    response_lengths: list[int],
    values_list: list[torch.Tensor],
    rewards_list: list[torch.Tensor],
    gamma: float,
    lambd: float,
    chunked: bool = True,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE per sample over its first `response_lengths[i]` tokens: `(advantages, returns)`."""
    if not len(response_lengths) == len(values_list) == len(rewards_list):
        raise ValueError("response_lengths, values_list and rewards_list differ in length")
    with torch.no_grad():
        rewards = [r[:n] for r, n in zip(rewards_list, response_lengths, strict=True)]
        values = [v[:n] for v, n in zip(values_list, response_lengths, strict=True)]
        advantages, returns = gae_advantages_and_returns(rewards, values, gamma, lambd)
    dtype = values_list[0].dtype
    return [a.to(dtype) for a in advantages], [r.to(dtype) for r in returns]


def vanilla_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on `[B, T]` rewards and values (0 after the last token): `(advantages, returns)`."""
    advantages, returns = gae_advantages_and_returns(list(rewards), list(values), gamma, lambd)
    return torch.stack(advantages).to(rewards.dtype), torch.stack(returns).to(rewards.dtype)


def chunked_discounted_returns(rewards: torch.Tensor, discount: float, chunk_size: int = 128) -> torch.Tensor:
    """`[B, T]` discounted returns `G_t = r_t + discount * G_{t+1}` (one backward pass over T,
    vectorized over B; `chunk_size` is slime's GPU scan width and does not change the result)."""
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [B, T], got shape {tuple(rewards.shape)}")
    out = torch.empty_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + discount * running
        out[:, t] = running
    return out


def chunked_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lambd: float, chunk_size: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE on `[B, T]` as the discounted sum (by `gamma * lambd`) of the TD errors."""
    if rewards.ndim != 2 or values.shape != rewards.shape:
        raise ValueError(f"rewards and values must both be [B, T]: {tuple(rewards.shape)}, {tuple(values.shape)}")
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    advantages = chunked_discounted_returns(rewards + gamma * next_values - values, gamma * lambd, chunk_size)
    return advantages, advantages + values


def _check_tp_group(tp_group: Any) -> None:
    if tp_group is None:
        return
    size = dist.get_world_size(tp_group) if dist.is_available() and dist.is_initialized() else 1
    if size != 1:
        raise SlimeError(
            f"calculate_log_probs_and_entropy: a tensor-parallel group of {size} ranks holds vocabulary "
            "shards (Megatron's layout); this repo's trainer keeps whole logits, pass tp_group=None"
        )


def _log_probs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool, with_entropy_grad: bool, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if keep is None:
        log_prob = compute_log_probs(logits, tokens)
    else:
        # the vocabulary outside the kept set (top-p) gets no probability; the target always stays
        keep = keep.clone()
        keep[torch.arange(tokens.shape[0], device=keep.device), tokens.long()] = True
        log_prob = compute_log_probs(logits.float().masked_fill(~keep, float("-inf")), tokens)
    entropy = None
    if with_entropy:
        entropy = compute_entropy(logits)
        if not with_entropy_grad:
            entropy = entropy.detach()
    return log_prob.unsqueeze(-1), entropy


def calculate_log_probs_and_entropy(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    tp_group: Any,
    with_entropy: bool = False,
    chunk_size: int = -1,
    log_prob_keep_mask: torch.Tensor | None = None,
    with_entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `tokens` under `[T, V]` logits, as `[T, 1]`, and with `with_entropy` the
    entropy `[T]` (of the full distribution); `log_prob_keep_mask` `[T, V]` restricts the
    log-prob's normalization to the kept vocabulary; `chunk_size > 0` works on that many rows at
    a time (same result)."""
    _check_tp_group(tp_group)
    if logits.size(0) == 0:
        return logits.new_zeros((0,)), logits.new_zeros((0,)) if with_entropy else None
    step = chunk_size if chunk_size > 0 else logits.size(0)
    pieces = [
        _log_probs_and_entropy(
            logits[i : i + step],
            tokens[i : i + step],
            with_entropy,
            with_entropy_grad,
            None if log_prob_keep_mask is None else log_prob_keep_mask[i : i + step],
        )
        for i in range(0, logits.size(0), step)
    ]
    log_prob = torch.cat([p[0] for p in pieces], dim=0)
    entropy = torch.cat([p[1] for p in pieces], dim=0) if with_entropy else None
    return log_prob, entropy
