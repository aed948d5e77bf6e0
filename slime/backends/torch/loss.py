"""Trainer-side RL math, wired to the arguments (slime's ``megatron_utils/loss.py`` for the torch backend).

* :func:`compute_advantages_and_returns`: once per rollout, per-token advantages (and returns for the
  critic) from the rank's samples, for every ``--advantage-estimator``, then OPD and whitening;
* :func:`policy_loss`: one micro-batch's PPO / GSPO loss with TIS, OPSM, entropy and KL terms.

Formulas live in ``slime/algorithms``; this module only decides which ones apply.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from slime.algorithms.advantages import (
    expand_to_tokens,
    gae_advantages_and_returns,
    masked_whiten,
    opd_penalize_advantages,
    ppo_token_rewards,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
)
from slime.algorithms.kl import compute_approx_kl
from slime.algorithms.losses import opsm_mask, ppo_clip_from_kl, sequence_ppo_kl, tis_weights
from slime.backends.torch.batching import MicroBatch, pack
from slime.errors import SlimeError
from slime.utils.misc import load_function


def compute_advantages_and_returns(
    args: Namespace, rollout_data: dict[str, Any], all_reduce_sum: Callable[[Tensor], Tensor] | None = None
) -> None:
    """Fill ``rollout_data['advantages']``, ``['returns']`` (and ``['kl']``, ``['opd_reverse_kl']``).

    ``rollout_data`` holds this rank's samples as lists: ``rewards`` (already group-normalised on
    the rollout side for grpo / gspo / rloo / reinforce_plus_plus_baseline), ``log_probs`` (old
    policy), ``ref_log_probs``, ``values`` (ppo), ``teacher_log_probs`` (OPD), ``loss_masks``.
    """
    log_probs: list[Tensor] = rollout_data["log_probs"]
    masks = [torch.as_tensor(m, dtype=torch.float32) for m in rollout_data["loss_masks"]]
    rewards = [float(r) for r in rollout_data["rewards"]]
    if args.kl_coef != 0.0:
        kl = [compute_approx_kl(lp, ref, args.kl_loss_type) for lp, ref in zip(log_probs, rollout_data["ref_log_probs"])]
    else:
        kl = [torch.zeros_like(lp, dtype=torch.float32) for lp in log_probs]
    rollout_data["kl"] = kl

    est = args.advantage_estimator
    if args.custom_advantage_function_path is not None:
        load_function(args.custom_advantage_function_path, arg_name="--custom-advantage-function-path")(args, rollout_data)
        advantages, returns = rollout_data["advantages"], rollout_data["returns"]
    elif est in ("grpo", "gspo", "rloo"):
        advantages = expand_to_tokens(torch.tensor(rewards), [lp.numel() for lp in log_probs])
        returns = advantages
    elif est == "reinforce_plus_plus":
        advantages = reinforce_plus_plus_returns(rewards, kl, masks, args.kl_coef, args.gamma)
        returns = advantages
    elif est == "reinforce_plus_plus_baseline":
        advantages = reinforce_plus_plus_baseline_advantages(rewards, kl, args.kl_coef)
        returns = advantages
    elif est == "ppo":
        token_rewards = ppo_token_rewards(rewards, kl, args.kl_coef)
        advantages, returns = gae_advantages_and_returns(token_rewards, rollout_data["values"], args.gamma, args.lambd)
    else:  # the parser's choices make this unreachable
        raise SlimeError(f"--advantage-estimator {est} is not supported")

    if args.use_opd:
        teacher = rollout_data.get("teacher_log_probs")
        if teacher is None:
            raise SlimeError("--use-opd --opd-type sglang needs samples with teacher_log_probs "
                             "(set them in a --custom-rm-path or generate hook)")
        advantages, rollout_data["opd_reverse_kl"] = opd_penalize_advantages(advantages, log_probs, teacher,
                                                                            args.opd_kl_coef)
    if args.normalize_advantages and advantages:
        flat = masked_whiten(torch.cat(advantages), torch.cat(masks), all_reduce_sum=all_reduce_sum)
        advantages = list(torch.split(flat, [a.numel() for a in advantages]))
    rollout_data["advantages"] = advantages
    rollout_data["returns"] = returns


def policy_loss(
    args: Namespace, data: dict[str, Any], mb: MicroBatch, log_probs: Tensor, entropy: Tensor,
    reduce: Callable[[Tensor], Tensor],
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's policy loss; ``reduce`` is slime's sum-of-sample-mean over the global batch."""
    old = pack(data["old_log_probs"], mb.indices)
    adv = pack(data["advantages"], mb.indices)
    if args.advantage_estimator == "gspo":  # sequence-level ratio
        ppo_kl = sequence_ppo_kl(log_probs, old, mb.response_lengths, mb.loss_masks)
    else:
        ppo_kl = old - log_probs
    pg, clipfrac = ppo_clip_from_kl(ppo_kl, adv, args.eps_clip, args.eps_clip_high, args.eps_clip_c)
    metrics: dict[str, Tensor] = {}
    if args.use_opsm:
        keep = opsm_mask(log_probs, old, adv, mb.response_lengths, mb.loss_masks, args.opsm_delta)
        pg = pg * keep
        metrics["train/opsm_clipfrac"] = reduce(1.0 - keep)
    if args.use_tis:
        if "rollout_log_probs" not in data:
            raise SlimeError("--use-tis needs rollout log-probs, but the rollout function returned none")
        # The trainer's log-probs of the old policy (the current ones, detached, when the old policy
        # is the engine's own: --use-rollout-logprobs).
        train_lp = pack(data["train_log_probs"], mb.indices) if "train_log_probs" in data else log_probs.detach()
        w, tis_metrics = tis_weights(train_lp, pack(data["rollout_log_probs"], mb.indices), args.tis_clip,
                                     args.tis_clip_low)
        pg = pg * w
        metrics.update({f"train/{k}": reduce(v) for k, v in tis_metrics.items()})
        metrics["train/ois"] = reduce(torch.exp(-ppo_kl.detach()))
    pg_loss, entropy_loss = reduce(pg), reduce(entropy)
    loss = pg_loss - args.entropy_coef * entropy_loss
    metrics.update({"train/pg_loss": pg_loss, "train/pg_clipfrac": reduce(clipfrac),
                    "train/ppo_kl": reduce(ppo_kl), "train/entropy_loss": entropy_loss})
    if args.use_kl_loss:
        ratio = torch.exp(log_probs - old) if args.use_unbiased_kl else None
        kl_loss = reduce(compute_approx_kl(log_probs, pack(data["ref_log_probs"], mb.indices), args.kl_loss_type, ratio))
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["train/kl_loss"] = kl_loss
    return loss, metrics
