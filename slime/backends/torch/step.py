"""The policy's forward passes and one optimizer step over a rollout batch.

`forward_log_probs` is the no-grad pass (old / reference / teacher log-probs); `optimizer_step`
runs one global batch's micro-batches (forward, loss, backward), clips and steps. Both plan
micro-batches the same way: `--micro-batch-size` samples, or with `--use-dynamic-batch-size`
packed up to a token budget, `--max-tokens-per-gpu` for training and
`--log-probs-max-tokens-per-gpu` (slime's; default the former) for the no-grad pass, which keeps
no activations for a backward and so may take larger micro-batches. Each rank takes its slice of
every global batch; gradients are averaged by FSDP (or are local with one rank), so the loss is
normalised by the per-rank share.
"""

from __future__ import annotations

import logging
import math
from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.distributed as dist

from slime.algorithms.losses import reduce_loss, sft_loss
from slime.backends.torch import lora
from slime.backends.torch.batching import (
    MicroBatch,
    build_micro_batch,
    make_micro_batch,
    plan_micro_batches,
    response_log_probs,
)
from slime.backends.torch.data_parallel import DataParallel
from slime.backends.torch.device import autocast, to_device, to_host
from slime.backends.torch.diagnostics import ci_step
from slime.backends.torch.hooks import before_log_prob, before_train_step
from slime.backends.torch.loss import policy_loss
from slime.backends.torch.optim import reset_adam_state
from slime.backends.torch.rollout_batch import RolloutBatch
from slime.utils.misc import load_function

logger = logging.getLogger(__name__)


class Stepper(Protocol):
    """What a step reads and updates (a `TrainActor`)."""

    args: Namespace
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    device: torch.device
    pad_id: int
    ref_model: torch.nn.Module | None
    teacher_model: torch.nn.Module | None


def plan(
    args: Namespace, columns: Mapping[str, Any], indices: list[int], *, log_probs: bool = False
) -> list[list[int]]:
    """Micro-batches of `indices`; `log_probs`: of the no-grad log-prob pass (its own token budget)."""
    budget = None
    if args.use_dynamic_batch_size:
        budget = args.log_probs_max_tokens_per_gpu if log_probs else args.max_tokens_per_gpu
    return plan_micro_batches(columns, indices, args.micro_batch_size, budget)


def store_prefix(rank: Stepper, model: torch.nn.Module) -> str:
    """slime's name for the log-probs `model` computes: "ref_", "teacher_", or "" (the policy's)."""
    if model is rank.ref_model:
        return "ref_"
    if model is rank.teacher_model:
        return "teacher_"
    return ""


def micro_batch(rank: Stepper, columns: Mapping[str, Any], indices: list[int]) -> MicroBatch:
    a = rank.args
    mb = build_micro_batch(columns, indices, a.use_dynamic_batch_size, rank.pad_id, a.share_prompt_forward)
    return to_device(mb, rank.device)


@torch.no_grad()
def forward_log_probs(
    rank: Stepper,
    columns: Mapping[str, Any],
    indices: list[int],
    model: torch.nn.Module,
    entropy_out: list[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """Per-sample response log-probs; per-sample entropies appended to ``entropy_out`` if given."""
    out: list[torch.Tensor] = []
    was_training = model.training
    model.eval()
    before_log_prob(rank.args, model, store_prefix(rank, model))  # slime: after eval(), before the forward
    for mb_indices in plan(rank.args, columns, indices, log_probs=True):
        mb = micro_batch(rank, columns, mb_indices)
        lp, ent = response_log_probs(
            model,
            mb,
            rank.args.rollout_temperature,
            with_entropy=entropy_out is not None,
            chunk_size=rank.args.log_probs_chunk_size,
        )
        lp, ent = to_host(lp), to_host(ent)  # per-token values live on the host (no-op on the CPU)
        out += list(torch.split(lp, mb.response_lengths))
        if entropy_out is not None:
            entropy_out += list(torch.split(ent, mb.response_lengths))
    model.train(was_training)
    return out


def sequence_log_probs(rank: Stepper, token_ids: list[int]) -> torch.Tensor:
    """The policy's log-probs of tokens[1:] given their prefixes (temperature 1), on the host. In
    fp32, or, for a LoRA policy whose base weights are kept in bf16/fp16, in its autocast (the only
    precision that policy computes in)."""
    a = rank.args
    reduced = lora.has_reduced_base(rank.model)
    rank.model.eval()
    with torch.no_grad(), autocast(rank.device, a.bf16 and reduced, a.fp16 and reduced):
        data = {
            "tokens": [token_ids],
            "response_lengths": [len(token_ids) - 1],
            "loss_masks": [[1] * (len(token_ids) - 1)],
        }
        mb = to_device(make_micro_batch(data, [0], rank.pad_id), rank.device)
        out = to_host(response_log_probs(rank.model, mb, 1.0)[0])
    rank.model.train()
    return out


def reduce_kw(args: Namespace, batch: RolloutBatch, positions: list[int], dp: DataParallel) -> dict[str, Any]:
    """Global-batch denominators of slime's two reductions (same for every micro-batch of the step)."""
    num_tokens = float(sum(sum(batch.loss_masks[i]) for i in positions))
    # FAILED samples (and groups dropped for too few valid samples) are out of the sample average
    excluded = batch.excluded
    num_samples = float(len(positions) - sum(excluded[i] for i in positions)) if excluded else float(len(positions))
    if dp.size > 1 and (args.calculate_per_token_loss or excluded):
        t = dp.sum(torch.tensor([num_tokens, num_samples]))
        mean_tokens, mean_samples = (float(x) / dp.size for x in t)  # gradients are averaged over ranks
        num_tokens = mean_tokens if args.calculate_per_token_loss else num_tokens
        num_samples = mean_samples if excluded else num_samples
    return dict(
        calculate_per_token_loss=args.calculate_per_token_loss,
        num_samples=max(num_samples, 1.0) if excluded else len(positions),
        num_tokens=max(num_tokens, 1.0),
    )


def train_steps(rank: Any, batch: RolloutBatch, rollout_id: int, critic_only: bool) -> dict[str, float]:
    """Every optimizer step of a rollout (critic first, then the policy unless `critic_only`), one
    per global batch of this rank's share; the metrics averaged over the steps."""
    args, per_rank = rank.args, rank.args.global_batch_size // rank.dp.size
    if args.reset_optimizer_states:  # slime: at the start of every rollout's training, critic's too
        for owner in (rank, rank.critic):
            if owner is not None:
                reset_adam_state(owner.optimizer)
    sums: dict[str, float] = {}
    for start in range(0, len(batch), per_rank):
        positions = list(range(start, min(start + per_rank, len(batch))))
        reduce = reduce_kw(args, batch, positions, rank.dp)
        step_metrics: dict[str, float] = {}
        step_id = start // per_rank
        if rank.critic is not None:
            before_train_step(args, rollout_id, step_id, rank.critic)
            step_metrics.update(rank.critic.train_step(batch, positions, reduce))
        if not critic_only:
            before_train_step(args, rollout_id, step_id, rank)
            step_metrics.update(rank._optimizer_step(batch, positions, reduce))
        ci_step(args, rollout_id, step_id, step_metrics, writer=rank.is_rank0())
        for k, v in step_metrics.items():
            sums[k] = sums.get(k, 0.0) + v
    if args.ref_update_interval and rank.ref_model is not None and (rollout_id + 1) % args.ref_update_interval == 0:
        rank.copy_policy_into(rank.ref_model)
    return {k: v / max(1, len(batch) // per_rank) for k, v in sums.items()}


def optimizer_step(
    rank: Stepper, batch: RolloutBatch, positions: list[int], reduce_kw: dict[str, Any]
) -> dict[str, float]:
    """One optimizer step of the policy over the batch's samples `positions`."""
    args = rank.args
    stats: dict[str, float] = {}
    rank.optimizer.zero_grad(set_to_none=True)
    for mb_indices in plan(args, batch.sequences, positions):
        mb = micro_batch(rank, batch.sequences, mb_indices)
        loss, parts = _micro_batch_loss(rank, batch, mb, reduce_kw)
        loss.backward()
        for k, v in parts.items():  # each part is already this micro-batch's share of the step
            stats[k] = stats.get(k, 0.0) + float(v.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(rank.model.parameters(), args.clip_grad)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    grad_norm = float(grad_norm)
    stats["train/lr"] = rank.optimizer.param_groups[0]["lr"]
    if math.isfinite(grad_norm):
        rank.optimizer.step()
    else:
        logger.warning("non-finite grad norm (%s): optimizer step skipped", grad_norm)
    rank.scheduler.step()
    rank.optimizer.zero_grad(set_to_none=True)
    stats["train/grad_norm"] = grad_norm
    return stats


def _micro_batch_loss(
    rank: Stepper, batch: RolloutBatch, mb: MicroBatch, reduce_kw: dict[str, Any]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss (its share of the step's) and the parts it logs."""
    args = rank.args
    masks = mb.loss_masks
    # the entropy is always logged; it needs a graph only when it is in the loss
    log_probs, entropy = response_log_probs(
        rank.model,
        mb,
        args.rollout_temperature,
        with_entropy=True,
        chunk_size=args.log_probs_chunk_size,
        entropy_grad=args.entropy_coef != 0.0,
    )
    log_probs, entropy = to_host(log_probs), to_host(entropy)  # the losses run on the host
    if batch.old_from_training_forward:  # the old log-probs of this rollout's single step
        if batch.training_forward_log_probs is None:
            batch.training_forward_log_probs = [None] * len(batch)
        for i, lp in zip(mb.indices, torch.split(log_probs.detach(), mb.response_lengths), strict=True):
            batch.training_forward_log_probs[i] = lp
    denoms = [float(batch.rollout_mask_sums[i]) for i in mb.indices]

    def red(x: torch.Tensor) -> torch.Tensor:
        return reduce_loss(x, mb.response_lengths, masks, sample_denoms=denoms, **reduce_kw)

    if args.loss_type == "sft_loss":
        loss = sft_loss(log_probs, mb.response_lengths, masks, sample_denoms=denoms, **reduce_kw)
        return loss, {"train/loss": loss}
    if args.loss_type == "custom_loss":
        return custom_loss(rank, batch, mb, red)
    loss, parts = policy_loss(args, batch, mb, log_probs, entropy, reduce_kw, denoms)
    parts["train/loss"] = loss
    return loss, parts


def custom_loss(
    rank: Stepper, batch: RolloutBatch, mb: MicroBatch, red: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``--custom-loss-function-path``: ``fn(args, batch, logits, sum_of_sample_mean) -> (loss, metrics)``.

    ``logits`` are the response-aligned logits ``[sum R_i, V]`` (row j predicts response token j;
    not divided by the temperature); ``batch`` holds this micro-batch's per-sample lists.
    """
    fn = load_function(rank.args.custom_loss_function_path, arg_name="--custom-loss-function-path")
    logits = mb.response_logits(rank.model)
    columns = {
        k: getattr(batch, k)
        for k in ("old_log_probs", "ref_log_probs", "advantages", "returns", "rollout_log_probs", "rewards")
    }
    hook_batch = {
        "response_lengths": mb.response_lengths,
        "loss_masks": mb.loss_masks,
        "response_tokens": list(torch.split(mb.targets, mb.response_lengths)),
        **{k: [col[i] for i in mb.indices] for k, col in columns.items() if col is not None},
    }
    loss, metrics = fn(rank.args, hook_batch, logits, red)
    return loss, {(k if k.startswith("train/") else f"train/{k}"): v for k, v in metrics.items()}


def all_reduce_mean(metrics: dict[str, float], world_size: int) -> dict[str, float]:
    if world_size == 1:
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / world_size for k, v in zip(keys, t, strict=True)}
