"""One rank's share of a rollout as a typed batch, and what the trainer computes into it before
the optimizer steps: old / reference / teacher log-probs, critic values, advantages and returns.

`RolloutBatch` holds this rank's samples in training order. Every per-sample column is a list
with one entry per sample, position k being the sample `indices[k]` of the rollout's train data;
a column the rollout did not deliver, or the trainer did not compute, is None. The rollout's
data is read, never written.

`compute_advantages_and_returns` picks the estimator (the formulas are in `slime.algorithms`);
slime's hooks (`--custom-advantage-function-path`, `--rollout-data-postprocess-path`) see the
per-sample `rollout_data` dict they always did.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

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
from slime.backends.torch.batching import pack
from slime.errors import SlimeError
from slime.observability.sample_log import write_advantages
from slime.utils.misc import load_function
from slime.utils.seqlen_balancing import balanced_order

Column = list[Any]
# forward(columns, positions, model, entropy_out) -> per-sample response log-probs (entropies appended)
ForwardFn = Callable[[Mapping[str, Column], list[int], nn.Module, "list[Tensor] | None"], list[Tensor]]
SumFn = Callable[[Tensor], Tensor]


@dataclass
class RolloutBatch:
    """This rank's samples of a rollout. Column k-th entries are sample `indices[k]`'s; `pack`
    and the micro-batch builders index the columns by these positions."""

    indices: list[int]  # each sample's index in the rollout's train data
    tokens: Column
    response_lengths: Column
    loss_masks: Column  # as delivered, or those --rollout-data-postprocess-path returned
    rewards: Column
    rollout_mask_sums: list[float]  # each sample's delivered mask total (its per-sample mean's denominator)
    raw_reward: Column | None = None
    excluded: Column | None = None  # 1: out of every average (FAILED, or a dropped group)
    rollout_log_probs: Column | None = None  # the engine's, as delivered
    teacher_log_probs: Column | None = None  # as delivered (--opd-type sglang)
    # computed by the trainer
    old_log_probs: list[Tensor] | None = None
    train_log_probs: list[Tensor] | None = None  # the trainer's own of the old policy (TIS, mismatch metrics)
    mismatch_log_probs: list[Tensor] | None = None  # the same, when the old ones are the engine's
    ref_log_probs: list[Tensor] | None = None
    values: list[Tensor] | None = None
    advantages: list[Tensor] | None = None
    returns: list[Tensor] | None = None
    # one optimizer step whose forward gives the old log-probs too (`can_reuse_training_forward`)
    old_from_training_forward: bool = False
    training_forward_log_probs: list[Tensor | None] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # every column, set at construction or later, is a list with one entry per sample
        if value is not None and name not in _NOT_COLUMNS:
            if not isinstance(value, list):
                raise TypeError(
                    f"rollout batch column {name!r} must be a list with one entry per sample, got "
                    f"{type(value).__name__}"
                )
            if len(value) != len(self.indices):
                raise ValueError(f"rollout batch column {name!r} has {len(value)} entries for {len(self)} samples")
        super().__setattr__(name, value)

    def __len__(self) -> int:
        return len(self.indices)

    @classmethod
    def from_rollout(cls, data: Mapping[str, Any], mine: Sequence[int]) -> RolloutBatch:
        """This rank's samples `mine` (in training order) of the rollout's train columns."""

        def column(key: str) -> Column | None:
            return [data[key][i] for i in mine] if key in data else None

        def required(key: str) -> Column:
            return [data[key][i] for i in mine]

        sums = column("rollout_mask_sums")
        return cls(
            indices=list(mine),
            tokens=required("tokens"),
            response_lengths=required("response_lengths"),
            loss_masks=required("loss_masks"),
            rewards=required("rewards"),
            # fixed before any hook edits the masks
            rollout_mask_sums=sums if sums is not None else [float(sum(data["loss_masks"][i])) for i in mine],
            raw_reward=column("raw_reward"),
            excluded=column("excluded") if data.get("excluded") else None,
            rollout_log_probs=column("rollout_log_probs"),
            teacher_log_probs=column("teacher_log_probs"),
        )

    @property
    def sequences(self) -> dict[str, Column]:
        """The columns a micro-batch is built from (`slime.backends.torch.batching`)."""
        return {"tokens": self.tokens, "response_lengths": self.response_lengths, "loss_masks": self.loss_masks}

    def positions(self) -> list[int]:
        return list(range(len(self.indices)))

    def rollout_tensors(self) -> list[Tensor]:
        """The engine's log-probs as tensors (what the hooks get)."""
        return [torch.as_tensor(x) for x in self.rollout_log_probs]


_NOT_COLUMNS = frozenset({"indices", "old_from_training_forward"})


@dataclass
class BatchModels:
    """What preparing a batch runs: the forward pass over the rank's models, the critic, and the
    sum over ranks that makes the rollout metrics global."""

    args: Namespace
    forward: ForwardFn
    policy: nn.Module
    old_actor: nn.Module | None
    ref: nn.Module | None
    teacher: nn.Module | None
    critic: Any
    sum_over_ranks: SumFn
    rank: int = 0


def rank_positions(args: Namespace, lengths: list[int], rank: int, world_size: int) -> list[int]:
    """The rollout samples this rank trains on, in step order: its `global_batch_size / world_size`
    slice of every global batch (with --balance-data, sample orders evening out tokens per rank)."""
    n, per_rank = len(lengths), args.global_batch_size // world_size
    order = list(range(n))
    if args.balance_data and world_size > 1 and n % world_size == 0:
        order = balanced_order(lengths, world_size, per_rank)
    first = rank * per_rank
    return [order[s + first + j] for s in range(0, n, args.global_batch_size) for j in range(per_rank)]


def can_reuse_training_forward(
    args: Namespace, policy: nn.Module, old_actor: nn.Module | None, num_steps: int, critic_only: bool
) -> bool:
    """Whether the old log-probs may be the training forward's own (detached: ratio exactly 1):
    one optimizer step in the rollout, the policy trains, the old policy is the current one, and
    nothing reads the old log-probs before the training forward or besides it."""
    if num_steps != 1 or critic_only:
        return False
    if args.loss_type != "policy_loss" or args.use_rollout_logprobs or old_actor is not None:
        return False
    # --use-tis reads the old log-probs only inside the loss (its weights: old against rollout), where
    # they are the training forward's own: it needs no separate pass either
    needs_old_before = (
        args.use_opsm,
        args.get_mismatch_metrics,
        args.use_rollout_entropy,
        args.kl_coef != 0.0,
        args.use_opd,
        args.custom_advantage_function_path,
        args.rollout_data_postprocess_path,
        args.save_debug_train_data is not None,
    )
    if any(needs_old_before):
        return False
    # dropout: the training forward (train mode) would not be the old policy's (eval mode)
    config = policy.config.to_dict()
    return not any(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for k, v in config.items() if "dropout" in k
    )


def token_mean_of(loss_masks: Column, sum_over_ranks: SumFn) -> Callable[[list[Tensor]], float]:
    """Mean of per-token values over the trained tokens of every rank (one packed sum, float64)."""
    mask = pack(loss_masks, range(len(loss_masks)), torch.bool)
    count = float(mask.sum())

    def token_mean(xs: list[Tensor]) -> float:
        total = float(pack(xs, range(len(xs)), torch.float64)[mask].sum()) if count else 0.0
        s = sum_over_ranks(torch.tensor([total, count], dtype=torch.float64))
        return float(s[0] / max(float(s[1]), 1.0))

    return token_mean


def prepare_rl_batch(
    models: BatchModels, data: Mapping[str, Any], mine: Sequence[int], rollout_id: int = 0, reuse: bool = False
) -> tuple[RolloutBatch, dict[str, float]]:
    """The batch of this rank's samples with old / reference / teacher log-probs, critic values,
    advantages and returns; and the rollout metrics (`rollout/advantages`, ...). `reuse`: the old
    log-probs come from the training forward (`can_reuse_training_forward`)."""
    batch = RolloutBatch.from_rollout(data, mine)
    batch.old_from_training_forward = reuse
    entropy, ref_entropy, old = _old_log_probs(models, batch)
    if models.ref is not None:
        batch.ref_log_probs = models.forward(batch.sequences, batch.positions(), models.ref, ref_entropy)
    else:
        ref_entropy = None
    rollout_data = _rollout_data(models, batch, old, entropy, ref_entropy)
    compute_advantages_and_returns(models.args, rollout_data, models.sum_over_ranks)
    _postprocess(models.args, batch, rollout_id, rollout_data)
    batch.advantages = list(rollout_data["advantages"])
    # the report's logged samples, this rank's share
    write_advantages(
        models.args, rollout_id, {"advantages": dict(zip(mine, batch.advantages, strict=True))}, mine, models.rank
    )
    batch.returns = list(rollout_data["returns"])
    return batch, _rollout_metrics(models, batch, old, rollout_data)


def _old_log_probs(
    models: BatchModels, batch: RolloutBatch
) -> tuple[list[Tensor] | None, list[Tensor] | None, list[Tensor]]:
    """(entropies, reference entropies to collect, old log-probs); sets the batch's old, train and
    mismatch log-probs."""
    args, positions = models.args, batch.positions()
    # --use-rollout-entropy: entropies come with the old / reference forward passes (none when
    # the old log-probs are the engine's), as in slime
    entropy: list[Tensor] | None = [] if args.use_rollout_entropy else None
    ref_entropy: list[Tensor] | None = [] if args.use_rollout_entropy else None
    if args.use_rollout_logprobs:
        old = [torch.as_tensor(x, dtype=torch.float32) for x in batch.rollout_log_probs]
        entropy = None
        if args.get_mismatch_metrics:  # slime: one more forward pass for the trainer's own log-probs
            batch.mismatch_log_probs = models.forward(batch.sequences, positions, models.policy, None)
    elif batch.old_from_training_forward:
        # one optimizer step and nothing reads the old log-probs before it: they are the training
        # forward's own, detached (the policy loss's default), and the values here are never read
        # (only their lengths: no KL in the reward, no OPD, no custom estimator)
        old = [torch.zeros(int(n)) for n in batch.response_lengths]
    else:
        model = models.old_actor if models.old_actor is not None else models.policy
        old = models.forward(batch.sequences, positions, model, entropy)
        batch.train_log_probs = list(old)
    if not batch.old_from_training_forward:
        batch.old_log_probs = list(old)
    return entropy, ref_entropy, old


def _rollout_data(
    models: BatchModels,
    batch: RolloutBatch,
    old: list[Tensor],
    entropy: list[Tensor] | None,
    ref_entropy: list[Tensor] | None,
) -> dict[str, Any]:
    """slime's per-sample `rollout_data` (what the estimator and the hooks read); the batch takes
    the critic's values."""
    rollout_data: dict[str, Any] = {
        "log_probs": old,
        "rewards": list(batch.rewards),
        "loss_masks": list(batch.loss_masks),
        "response_lengths": list(batch.response_lengths),
    }
    if entropy is not None:
        rollout_data["entropy"] = entropy
    if ref_entropy is not None:
        rollout_data["ref_entropy"] = ref_entropy
    if batch.ref_log_probs is not None:
        rollout_data["ref_log_probs"] = list(batch.ref_log_probs)
    if batch.rollout_log_probs is not None:
        rollout_data["rollout_log_probs"] = batch.rollout_tensors()
    if models.teacher is not None:
        rollout_data["teacher_log_probs"] = models.forward(batch.sequences, batch.positions(), models.teacher, None)
    elif batch.teacher_log_probs is not None:
        rollout_data["teacher_log_probs"] = list(batch.teacher_log_probs)
    if models.critic is not None:
        rollout_data["values"] = models.critic.values(batch.sequences, batch.positions())
        batch.values = list(rollout_data["values"])
    return rollout_data


def _rollout_metrics(
    models: BatchModels, batch: RolloutBatch, old: list[Tensor], rollout_data: dict[str, Any]
) -> dict[str, float]:
    extra: dict[str, float] = {}
    token_mean = token_mean_of(rollout_data["loss_masks"], models.sum_over_ranks)
    for key in ("entropy", "ref_entropy"):
        if key in rollout_data:
            extra[f"rollout/{key}"] = token_mean(rollout_data[key])
    adv = rollout_data["advantages"]
    mean = token_mean(adv)
    extra["rollout/advantages"] = mean
    extra["rollout/advantages_std"] = max(token_mean([(pack(adv, range(len(adv))) - mean) ** 2]), 0.0) ** 0.5
    extra["rollout/returns"] = token_mean(rollout_data["returns"])
    if models.critic is not None:
        extra["rollout/values"] = token_mean(rollout_data["values"])
    if "opd_reverse_kl" in rollout_data:
        extra["train/opd_reverse_kl"] = token_mean(rollout_data["opd_reverse_kl"])
    if batch.rollout_log_probs is not None and not batch.old_from_training_forward:  # else: after the training forward
        diffs = [(o - r).abs() for o, r in zip(old, rollout_data["rollout_log_probs"], strict=True)]
        extra["train/train_rollout_logprob_abs_diff"] = token_mean(diffs)
    return extra


def compute_advantages_and_returns(
    args: Namespace, rollout_data: dict[str, Any], all_reduce_sum: Callable[[Tensor], Tensor] | None = None
) -> None:
    """Fill ``rollout_data['advantages']``, ``['returns']`` (and ``['kl']``, ``['opd_reverse_kl']``).

    ``rollout_data`` holds this rank's samples as lists: ``rewards`` (already group-normalised on
    the rollout side for grpo / gspo / rloo / reinforce_plus_plus_baseline), ``log_probs`` (old
    policy), ``ref_log_probs``, ``values`` (ppo), ``teacher_log_probs`` (OPD), ``loss_masks``.
    """
    log_probs: list[Tensor] = rollout_data["log_probs"]
    lengths = [lp.numel() for lp in log_probs]
    masks = list(pack(rollout_data["loss_masks"], range(len(lengths))).split(lengths))
    rewards = [float(r) for r in rollout_data["rewards"]]
    if args.kl_coef != 0.0:
        kl = [
            compute_approx_kl(lp, ref, args.kl_loss_type)
            for lp, ref in zip(log_probs, rollout_data["ref_log_probs"], strict=True)
        ]
    else:
        kl = list(torch.zeros(sum(lengths)).split(lengths))
    rollout_data["kl"] = kl

    est = args.advantage_estimator
    if args.custom_advantage_function_path is not None:
        load_function(args.custom_advantage_function_path, arg_name="--custom-advantage-function-path")(
            args, rollout_data
        )
        advantages, returns = rollout_data["advantages"], rollout_data["returns"]
    elif est in ("grpo", "gspo", "cispo", "rloo"):
        advantages = expand_to_tokens(torch.tensor(rewards), lengths)
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
            raise SlimeError(
                "--use-opd --opd-type sglang needs samples with teacher_log_probs "
                "(set them in a --custom-rm-path or generate hook)"
            )
        advantages, rollout_data["opd_reverse_kl"] = opd_penalize_advantages(
            advantages, log_probs, teacher, args.opd_kl_coef
        )
    if args.normalize_advantages and advantages:
        flat = masked_whiten(torch.cat(advantages), torch.cat(masks), all_reduce_sum=all_reduce_sum)
        advantages = list(torch.split(flat, [a.numel() for a in advantages]))
    rollout_data["advantages"] = advantages
    rollout_data["returns"] = returns


def reused_forward_metrics(batch: RolloutBatch, sum_over_ranks: SumFn) -> dict[str, float]:
    """What the separate old-log-prob pass would have reported, from the training forward's log-probs."""
    if batch.rollout_log_probs is None:
        return {}
    positions = batch.positions()
    token_mean = token_mean_of(batch.loss_masks, sum_over_ranks)
    diff = (pack(batch.training_forward_log_probs, positions) - pack(batch.rollout_log_probs, positions)).abs()
    return {"train/train_rollout_logprob_abs_diff": token_mean([diff])}


def prepare_plain_batch(args: Namespace, data: Mapping[str, Any], mine: Sequence[int], rollout_id: int) -> RolloutBatch:
    """``--loss-type sft_loss`` / ``--disable-compute-advantages-and-returns``: no forward pass, no
    estimator; the postprocess hook still runs and may set ``advantages`` (and ``returns``)."""
    batch = RolloutBatch.from_rollout(data, mine)
    rollout_data: dict[str, Any] = {
        "rewards": list(batch.rewards),
        "loss_masks": list(batch.loss_masks),
        "response_lengths": list(batch.response_lengths),
    }
    if batch.rollout_log_probs is not None:
        rollout_data["rollout_log_probs"] = batch.rollout_tensors()
        if args.use_rollout_logprobs:
            batch.old_log_probs = list(rollout_data["rollout_log_probs"])
    _postprocess(args, batch, rollout_id, rollout_data)
    for key in ("advantages", "returns"):
        if key in rollout_data:
            setattr(batch, key, list(rollout_data[key]))
    return batch


def _postprocess(args: Namespace, batch: RolloutBatch, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """slime's ``--rollout-data-postprocess-path`` (after advantages, before training). Its
    ``loss_masks`` are the ones trained on (a special loss mask, e.g. from ``entropy``); the
    per-sample denominators stay those the rollout delivered (``rollout_mask_sums``), as slime's."""
    if not args.rollout_data_postprocess_path:
        return
    load_function(args.rollout_data_postprocess_path, arg_name="--rollout-data-postprocess-path")(
        args, rollout_id, rollout_data
    )
    batch.loss_masks = [m for _, m in zip(batch.indices, rollout_data["loss_masks"], strict=True)]
