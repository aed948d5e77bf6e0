"""Train/rollout mismatch metrics (`--get-mismatch-metrics`): how far the trainer's log-probs of the
sampled tokens are from the engine's. The formulas of slime's `add_ppl_metrics`
(examples/train_infer_mismatch_helper/mis.py), logged as `train/mis_<name>`.

Per-token tensors, packed like the log-probs; a per-sequence value is repeated over its tokens, so
the usual reduction (mean per sample, then over samples; or per token) gives slime's numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

SAFETY_BOUND = 20.0  # slime's clamp on log-ratios before exp


def _seq_mean(x: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    """The masked mean of one sequence's `x`, repeated at each of its tokens."""
    return ((x * mask).sum() / count).expand_as(x)


def mismatch_metrics(
    train_log_probs: Tensor, rollout_log_probs: Tensor, response_lengths: Sequence[int], loss_masks: Sequence[Tensor]
) -> dict[str, Tensor]:
    """`train_log_probs`, `rollout_log_probs`: packed per-token log-probs of the same tokens."""
    if train_log_probs.shape != rollout_log_probs.shape:
        raise ValueError(
            f"shape mismatch: train_log_probs {tuple(train_log_probs.shape)}, "
            f"rollout_log_probs {tuple(rollout_log_probs.shape)}"
        )
    out: dict[str, list[Tensor]] = {}

    def add(name: str, value: Tensor) -> None:
        out.setdefault(name, []).append(value)

    train_parts = torch.split(train_log_probs.detach().float(), list(response_lengths))
    rollout_parts = torch.split(rollout_log_probs.detach().float(), list(response_lengths))
    for train, rollout, mask in zip(train_parts, rollout_parts, loss_masks, strict=True):
        mask = torch.as_tensor(mask, dtype=torch.float32)
        count = mask.sum().clamp_min(1)
        mean_train, mean_rollout = _seq_mean(train, mask, count), _seq_mean(rollout, mask, count)
        add("training_log_ppl", -mean_train)
        add("training_ppl", torch.exp(-mean_train))
        add("rollout_log_ppl", -mean_rollout)
        add("rollout_ppl", torch.exp(-mean_rollout))
        add("kl", rollout - train)  # KL(rollout || train), direct estimator
        log_ratio = train - rollout
        add("k3_kl", torch.exp(log_ratio) - log_ratio - 1)
        log_ppl_diff = mean_rollout - mean_train
        add("log_ppl_diff", log_ppl_diff)
        add("log_ppl_abs_diff", log_ppl_diff.abs())
        add("ppl_ratio", torch.exp(log_ppl_diff))
        rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
        add("chi2_token", _seq_mean(rho.square(), mask, count) - 1.0)
        seq_log_ratio = (log_ratio * mask).sum().clamp(-SAFETY_BOUND, SAFETY_BOUND)
        add("chi2_seq", torch.exp(2.0 * seq_log_ratio).expand_as(train) - 1.0)
    return {f"mis_{k}": torch.cat(v) for k, v in out.items()}
