"""slime's `slime.observability.train_metric_utils`: the trainer-side metric reductions across
data-parallel ranks and the logging of `multi_turn/*` and `passrate/*`.

Without Megatron the data-parallel group is torch.distributed's default group when one is
initialized (every rank a data-parallel rank, no tensor/pipeline/context parallelism), else this
process alone. `log_rollout_data` and `log_perf_data` read Megatron's parallel state and slime's
process-wide Timer; this repo's trainer logs `rollout/*` and `perf/*` itself (metrics.jsonl), so
they raise SlimeError saying so.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from slime.errors import SlimeError
from slime.observability import logging_utils
from slime.observability.metric_utils import compute_pass_rate, compute_rollout_step

__all__ = [
    "reduce_train_step_metrics",
    "rollout_log_metric_contribution",
    "gather_and_reduce_log_dict",
    "gather_log_data",
    "log_rollout_data",
    "log_multi_turn_data",
    "log_passrate",
    "log_perf_data",
]

logger = logging.getLogger(__name__)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def reduce_train_step_metrics(
    losses_reduced: list[dict],
    *,
    calculate_per_token_loss: bool,
    step_global_batch_size: int,
    cp_size: int,
    dp_with_cp_group: Any,
) -> dict[str, float]:
    """The step's metrics from the micro-batches' `{"keys", "values"}` (values[0]: the token
    count): summed, summed over the group's ranks, then divided per token (times `cp_size`, which
    cancels the full-mask token count every context-parallel rank reports) or per rollout (by
    `step_global_batch_size`)."""
    keys = losses_reduced[0]["keys"]
    values = sum(item["values"] for item in losses_reduced[1:]) + losses_reduced[0]["values"]
    if len(keys) + 1 != values.numel():
        raise ValueError(f"{len(keys)} keys for {values.numel()} values (the first value is the token count)")
    if _distributed():
        dist.all_reduce(values, group=dp_with_cp_group)
    totals = values.tolist()
    if calculate_per_token_loss:
        denominator, factor = totals[0], cp_size
    else:
        denominator, factor = step_global_batch_size, 1
    return {key: value * factor / denominator for key, value in zip(keys, totals[1:], strict=True)}


def rollout_log_metric_contribution(
    per_rank_reducer_sum: float, *, cp_size: int, num_rollouts_in_rollout: int, dp_size: int
) -> tuple[float, float]:
    """`(sum, count)` of a per-rollout-mean metric on one rank: summed over the data x context
    parallel ranks, `sum / count` is the mean over the rollouts."""
    return cp_size * per_rank_reducer_sum, num_rollouts_in_rollout / dp_size


def gather_and_reduce_log_dict(log_dict: dict, *, dp_size: int, dp_src_rank: int, dp_group: Any) -> dict | None:
    """On `dp_src_rank`: each metric over the ranks, `(sum, count)` pairs as `sum of sums / sum
    of counts`, plain values as their mean; None on the other ranks."""
    if _distributed():
        if dist.get_rank() != dp_src_rank:
            dist.gather_object(log_dict, None, dst=dp_src_rank, group=dp_group)
            return None
        gathered: list[Any] = [None] * dp_size
        dist.gather_object(log_dict, gathered, dst=dp_src_rank, group=dp_group)
    else:
        if dp_size != 1:
            raise SlimeError(f"gather_and_reduce_log_dict: dp_size {dp_size} without torch.distributed initialized")
        gathered = [log_dict]
    reduced: dict = {}
    for key in log_dict:
        values = [item[key] for item in gathered]
        if isinstance(values[0], tuple) and len(values[0]) == 2:
            count = sum(v[1] for v in values)
            reduced[key] = sum(v[0] for v in values) / count if count else 0.0
        else:
            reduced[key] = sum(values) / dp_size
    return reduced


def gather_log_data(
    metric_name: str, args: Namespace, rollout_id: int, log_dict: dict[str, float | tuple[float, float]]
) -> dict[str, float] | None:
    """Reduce `log_dict` over the ranks and log it on rank 0 as `<metric_name>/<key>` at `rollout/step`."""
    world = dist.get_world_size() if _distributed() else 1
    reduced = gather_and_reduce_log_dict(log_dict, dp_size=world, dp_src_rank=0, dp_group=None)
    if reduced is None:
        return None
    out = {f"{metric_name}/{key}": value for key, value in reduced.items()}
    logger.info("%s %s: %s", metric_name, rollout_id, out)
    out["rollout/step"] = compute_rollout_step(args, rollout_id)
    logging_utils.log(args, out, step_key="rollout/step")
    return out


def log_rollout_data(rollout_id: int, args: Namespace, rollout_data: dict[str, Any]) -> None:
    raise SlimeError(
        "train_metric_utils.log_rollout_data reads Megatron's parallel state (tensor/pipeline/context "
        "ranks); this repo's trainer logs rollout/* itself into <run-dir>/metrics.jsonl. Use "
        "rollout_metrics.log_rollout_data for a rollout's samples, or gather_log_data for your own metrics."
    )


def log_multi_turn_data(rollout_id: int, args: Namespace, rollout_data: dict[str, Any]) -> dict[str, float] | None:
    """`multi_turn/*`: response lengths with and without the observation tokens (the loss masks'
    lengths and sums) and `round_number` statistics."""
    out: dict[str, float] = {}
    masks = rollout_data.get("loss_masks")
    if masks:
        raw = torch.tensor([m.shape[0] for m in masks], dtype=torch.float32)
        trained = torch.tensor([m.sum().item() for m in masks], dtype=torch.float32)
        for name, lengths in (("raw_response_length", raw), ("wo_obs_response_length", trained)):
            out[f"{name}/response_length_mean"] = lengths.mean().item()
            out[f"{name}/response_length_max"] = lengths.max().item()
            out[f"{name}/response_length_min"] = lengths.min().item()
        clipped = (raw >= args.rollout_max_response_len).float().mean().item()
        out["raw_response_length/response_length_clip_ratio"] = clipped
    if "round_number" in rollout_data:
        rounds = np.asarray(rollout_data["round_number"])
        out["multi_turn_metric/round_number_mean"] = float(np.mean(rounds))
        out["multi_turn_metric/round_number_max"] = float(np.max(rounds))
        out["multi_turn_metric/round_number_min"] = float(np.min(rounds))
    return gather_log_data("multi_turn", args, rollout_id, out)


def log_passrate(rollout_id: int, args: Namespace, rollout_data: dict[str, Any]) -> dict[str, float] | None:
    """`passrate/pass@k` of the rollout's `raw_reward` (groups of `--n-samples-per-prompt`)."""
    out: dict[str, float] = {}
    if "raw_reward" in rollout_data:
        out |= compute_pass_rate(
            flat_rewards=rollout_data["raw_reward"],
            group_size=args.n_samples_per_prompt,
            num_groups=args.rollout_batch_size,
        )
    return gather_log_data("passrate", args, rollout_id, out)


def log_perf_data(rollout_id: int, args: Namespace, extra_metrics: dict | None = None) -> None:
    raise SlimeError(
        "train_metric_utils.log_perf_data reads slime's process-wide Timer and Megatron's parallel state; "
        "this repo's trainer records perf/*_time itself (slime.observability.timer) into "
        "<run-dir>/metrics.jsonl. Log your own perf metrics with gather_log_data."
    )
