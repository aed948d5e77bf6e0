"""What a training rank checks and writes besides training: `--ci-test`'s checks on each optimizer
step (`slime.observability.ci_checks`) and `--save-debug-train-data`'s dump of the samples with
what was computed for them (`slime.observability.debug_data`)."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import torch
import torch.distributed as dist

from slime.backends.torch.rollout_batch import RolloutBatch
from slime.observability.ci_checks import check_train_step, save_or_check_grad_norm
from slime.observability.debug_data import save_train_data

# per-sample columns of --save-debug-train-data: saved name -> column of the batch
DEBUG_TRAIN_COLUMNS = {
    "tokens": "tokens",
    "response_length": "response_lengths",
    "loss_mask": "loss_masks",
    "reward": "rewards",
    "raw_reward": "raw_reward",
    "log_probs": "old_log_probs",
    "ref_log_probs": "ref_log_probs",
    "rollout_log_probs": "rollout_log_probs",
    "advantages": "advantages",
    "returns": "returns",
    "values": "values",
}


def ci_step(args: Namespace, rollout_id: int, step_id: int, step_metrics: dict[str, float], writer: bool) -> None:
    """--ci-test's on-policy checks and --ci-save/load-grad-norm on one optimizer step."""
    check_train_step(args, rollout_id, step_id, step_metrics)
    if "train/grad_norm" in step_metrics:
        save_or_check_grad_norm(args, rollout_id, step_id, step_metrics["train/grad_norm"], writer=writer)


def save_debug_train_data(
    args: Namespace, rollout_id: int, batch: RolloutBatch, rank: int, world_size: int, dp_rank: int
) -> None:
    """--save-debug-train-data: rank 0 writes every data-parallel rank's samples with what was
    computed for them (once: tensor-parallel ranks hold the same samples)."""

    def plain(v: Any) -> Any:
        return v.tolist() if isinstance(v, torch.Tensor) else v

    columns = {name: getattr(batch, col) for name, col in DEBUG_TRAIN_COLUMNS.items()}
    local = [
        {
            "sample_index": i,
            "data_parallel_rank": dp_rank,
            **{name: plain(col[k]) for name, col in columns.items() if col is not None},
        }
        for k, i in enumerate(batch.indices)
    ]
    if world_size > 1:
        parts: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(local, parts, dst=0)
        firsts = {part[0]["data_parallel_rank"]: part for part in reversed(parts or []) if part}
        local = [s for _, part in sorted(firsts.items()) for s in part]
    if rank == 0:
        save_train_data(args.save_debug_train_data, rollout_id, rank, local, readable=args.dump_details is not None)
