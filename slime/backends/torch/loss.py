"""The trainer's policy loss, wired to the arguments (slime's ``megatron_utils/loss.py`` for the torch
backend): one micro-batch's PPO / GSPO / CISPO loss with TIS (or ``--custom-tis-function-path``),
OPSM, entropy and KL terms, ``pg_loss`` reduced by ``--custom-pg-loss-reducer-function-path`` if given.
The per-rollout advantages and returns are computed with the batch (`slime.backends.torch.rollout_batch`).

Formulas live in ``slime/algorithms``; this module only decides which ones apply.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from slime.algorithms.kl import compute_approx_kl
from slime.algorithms.losses import cispo_loss, opsm_mask, ppo_clip_from_kl, reduce_loss, sequence_ppo_kl, tis_weights
from slime.algorithms.mismatch import mismatch_metrics
from slime.backends.torch.batching import MicroBatch, pack
from slime.backends.torch.rollout_batch import RolloutBatch
from slime.errors import SlimeError
from slime.utils.misc import load_function


def policy_loss(
    args: Namespace,
    batch: RolloutBatch,
    mb: MicroBatch,
    log_probs: Tensor,
    entropy: Tensor,
    reduce_kw: dict[str, Any],
    sample_denoms: list[float] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One micro-batch's policy loss.

    ``reduce_kw`` holds the global-batch denominators of slime's sum-of-sample-mean (or token sum);
    ``sample_denoms`` each sample's mask total as the rollout delivered it. Without
    ``old_log_probs`` (``--disable-compute-advantages-and-returns``) the policy is its own old
    policy, as in slime.
    """
    lengths = mb.response_lengths

    def reducer(masks: list[Tensor]) -> Callable[[Tensor], Tensor]:
        return lambda x: reduce_loss(x, lengths, masks, sample_denoms=sample_denoms, **reduce_kw)

    reduce = reducer(mb.loss_masks)
    if batch.advantages is None:
        raise SlimeError(
            "--loss-type policy_loss needs advantages; with --disable-compute-advantages-and-returns "
            "set rollout_data['advantages'] in --rollout-data-postprocess-path"
        )
    old = pack(batch.old_log_probs, mb.indices) if batch.old_log_probs is not None else log_probs.detach()
    adv = pack(batch.advantages, mb.indices)
    if args.advantage_estimator == "gspo":  # sequence-level ratio
        ppo_kl = sequence_ppo_kl(log_probs, old, lengths, mb.loss_masks)
    else:
        ppo_kl = old - log_probs
    if args.advantage_estimator == "cispo":
        pg, clipfrac = cispo_loss(ppo_kl, log_probs, adv, args.eps_clip, args.eps_clip_high)
    else:
        pg, clipfrac = ppo_clip_from_kl(ppo_kl, adv, args.eps_clip, args.eps_clip_high, args.eps_clip_c)
    metrics: dict[str, Tensor] = {}
    if args.use_opsm:
        keep = opsm_mask(log_probs, old, adv, lengths, mb.loss_masks, args.opsm_delta)
        pg = pg * keep
        metrics["train/opsm_clipfrac"] = reduce(1.0 - keep)
    pg_masks = mb.loss_masks
    if args.use_tis:
        pg, pg_masks, tis_metrics = _importance_sampling(args, batch, mb, log_probs, ppo_kl, pg, reducer)
        if pg_masks is not mb.loss_masks:
            # slime: rejected tokens leave the numerators of everything reduced below; the
            # denominators stay those of the delivered masks (sample_denoms / num_tokens).
            reduce = reducer(pg_masks)
        metrics.update(tis_metrics)
    if args.get_mismatch_metrics:  # train/mis_*: diagnostics only, the loss is unchanged
        metrics.update(_mismatch_metrics(batch, mb, log_probs, reducer(mb.loss_masks)))
    if args.custom_pg_loss_reducer_function_path is not None:
        pg_loss = _custom_pg_reduce(args, pg, pg_masks, mb, reduce_kw)
    else:
        pg_loss = reduce(pg)
    entropy_loss = reduce(entropy)
    loss = pg_loss - args.entropy_coef * entropy_loss
    metrics.update(
        {
            "train/pg_loss": pg_loss,
            "train/pg_clipfrac": reduce(clipfrac),
            "train/ppo_kl": reduce(ppo_kl),
            "train/entropy_loss": entropy_loss,
        }
    )
    if args.use_kl_loss:
        ratio = torch.exp(log_probs - old) if args.use_unbiased_kl else None
        kl_loss = reduce(compute_approx_kl(log_probs, pack(batch.ref_log_probs, mb.indices), args.kl_loss_type, ratio))
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["train/kl_loss"] = kl_loss
    return loss, metrics


def _importance_sampling(
    args: Namespace,
    batch: RolloutBatch,
    mb: MicroBatch,
    log_probs: Tensor,
    ppo_kl: Tensor,
    pg: Tensor,
    reducer: Callable[[list[Tensor]], Callable[[Tensor], Tensor]],
) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
    """``--use-tis``: the per-token loss weighted by the truncated importance weights (or
    ``--custom-tis-function-path``'s loss and masks), and the metrics of the weights."""
    if batch.rollout_log_probs is None:
        raise SlimeError("--use-tis needs rollout log-probs, but the rollout function returned none")
    # The trainer's log-probs of the old policy (the current ones, detached, when the old policy
    # is the engine's own: --use-rollout-logprobs).
    train_lp = pack(batch.train_log_probs, mb.indices) if batch.train_log_probs is not None else log_probs.detach()
    rollout_lp = pack(batch.rollout_log_probs, mb.indices)
    pg_masks = mb.loss_masks
    if args.custom_tis_function_path is not None:
        pg, pg_masks, tis_metrics = _custom_tis(args, pg, train_lp, rollout_lp, mb)
    else:
        w, tis_metrics = tis_weights(train_lp, rollout_lp, args.tis_clip, args.tis_clip_low)
        pg = pg * w
    # mismatch metrics over the tokens before any rejection, as slime
    metrics = {f"train/{k}": reducer(mb.loss_masks)(v) for k, v in tis_metrics.items()}
    metrics["train/ois"] = reducer(mb.loss_masks)(torch.exp(-ppo_kl.detach()))
    return pg, pg_masks, metrics


def _mismatch_metrics(
    batch: RolloutBatch, mb: MicroBatch, log_probs: Tensor, reduce: Callable[[Tensor], Tensor]
) -> dict[str, Tensor]:
    """``--get-mismatch-metrics``: the trainer's log-probs of the weights that sampled (as the TIS
    weights use them) against the engine's."""
    if batch.rollout_log_probs is None:
        raise SlimeError("--get-mismatch-metrics needs rollout log-probs, but the rollout function returned none")
    own = next((c for c in (batch.train_log_probs, batch.mismatch_log_probs) if c is not None), None)
    train_lp = pack(own, mb.indices) if own is not None else log_probs.detach()
    mis = mismatch_metrics(train_lp, pack(batch.rollout_log_probs, mb.indices), mb.response_lengths, mb.loss_masks)
    return {f"train/{k}": reduce(v) for k, v in mis.items()}


def _custom_tis(
    args: Namespace, pg: Tensor, train_lp: Tensor, rollout_lp: Tensor, mb: MicroBatch
) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
    """slime's ``--custom-tis-function-path`` contract: keyword arguments, per-sample lists (packed
    ``pg_loss``); returns ``(pg_loss, loss_masks, metrics)`` — the weighted per-token loss, the
    masks whose zeros reject tokens, per-token metric tensors (logged as ``train/<key>``)."""
    fn = load_function(args.custom_tis_function_path, arg_name="--custom-tis-function-path")
    lengths = mb.response_lengths
    out = fn(
        args=args,
        pg_loss=pg,
        train_log_probs=list(torch.split(train_lp, lengths)),
        rollout_log_probs=list(torch.split(rollout_lp, lengths)),
        loss_masks=list(mb.loss_masks),
        total_lengths=[p + r for p, r in zip(mb.prompt_lengths, lengths, strict=True)],
        response_lengths=list(lengths),
    )
    if not (isinstance(out, tuple) and len(out) == 3):
        raise SlimeError(
            f"--custom-tis-function-path {args.custom_tis_function_path} must return "
            f"(pg_loss, loss_masks, metrics), got {type(out).__name__}"
        )
    new_pg, masks, tis_metrics = out
    if not isinstance(new_pg, Tensor) or new_pg.shape != pg.shape:
        raise SlimeError(
            f"--custom-tis-function-path {args.custom_tis_function_path}: pg_loss must be a tensor "
            f"of shape {tuple(pg.shape)}, got {getattr(new_pg, 'shape', type(new_pg).__name__)}"
        )
    masks = [torch.as_tensor(m, dtype=torch.float32) for m in masks]
    if [m.numel() for m in masks] != list(lengths):
        raise SlimeError(
            f"--custom-tis-function-path {args.custom_tis_function_path}: loss_masks must have one "
            f"mask per sample of lengths {list(lengths)}, got {[m.numel() for m in masks]}"
        )
    return new_pg, masks, {k: v.detach() for k, v in tis_metrics.items()}


def _custom_pg_reduce(
    args: Namespace, pg: Tensor, masks: list[Tensor], mb: MicroBatch, reduce_kw: dict[str, Any]
) -> Tensor:
    """slime's ``--custom-pg-loss-reducer-function-path``: ``fn(total_lengths, response_lengths,
    loss_masks, calculate_per_token_loss)`` returns a reducer whose output is a *sum* over this
    micro-batch, like slime's ``sum_of_sample_mean``; it is divided by the same global-batch
    denominator as every other term (samples, or tokens with ``--calculate-per-token-loss``)."""
    fn = load_function(args.custom_pg_loss_reducer_function_path, arg_name="--custom-pg-loss-reducer-function-path")
    lengths = mb.response_lengths
    reducer = fn(
        [p + r for p, r in zip(mb.prompt_lengths, lengths, strict=True)],
        list(lengths),
        list(masks),
        reduce_kw["calculate_per_token_loss"],
    )
    total = reducer(pg)
    if not isinstance(total, Tensor) or total.numel() != 1:
        raise SlimeError(
            f"--custom-pg-loss-reducer-function-path {args.custom_pg_loss_reducer_function_path}: "
            f"the reducer must return a scalar tensor, got {getattr(total, 'shape', type(total).__name__)}"
        )
    denom = reduce_kw["num_tokens"] if reduce_kw["calculate_per_token_loss"] else reduce_kw["num_samples"]
    return total.reshape(()) / max(denom, 1)
