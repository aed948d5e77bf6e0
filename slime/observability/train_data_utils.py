"""slime's `slime.observability.train_data_utils`: the train-side debug dump
(`--save-debug-train-data`), in slime's format 2: a `samples` list aligned with the rollout dump's
samples, plus `dp_shards` holding each data-parallel rank's batch layout.

Without Megatron, the ranks are torch.distributed's (a process group when one is initialized,
else this process alone), each rank a data-parallel rank, and there is no context parallelism:
`restore_context_parallel_fields_to_cpu` still takes the gather function for callers that shard.
"""

from __future__ import annotations

import logging
from argparse import Namespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["restore_context_parallel_fields_to_cpu", "save_debug_train_data"]

logger = logging.getLogger(__name__)

# per-token fields a context-parallel rank holds only a slice of
_CONTEXT_PARALLEL_FIELDS = (
    "rollout_log_probs",
    "teacher_log_probs",
    "log_probs",
    "ref_log_probs",
    "values",
    "advantages",
    "returns",
    "kl",
    "entropy",
    "opd_reverse_kl",
)
# the rank's batch layout, not per sample
_LAYOUT_FIELDS = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")
# the same on every rank: stored once
_WHOLE_BATCH_FIELDS = ("raw_reward",)
# per-sample ids surfaced as scalar keys of each sample record
_ID_COLUMNS = {"sample_indices": "sample_index", "partition": "rollout_position"}


def _to_cpu(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


@torch.no_grad()
def restore_context_parallel_fields_to_cpu(
    rollout_data: dict[str, Any],
    gather_tensor: Callable[[torch.Tensor, int, int], torch.Tensor],
    *,
    keep_restored: bool,
) -> dict[str, Any] | None:
    """Each sample's full response tensor of every `_CONTEXT_PARALLEL_FIELDS` field, from
    `gather_tensor(local, total_length, response_length)`, one tensor at a time; with
    `keep_restored` a CPU copy of the batch with those fields restored, else None (every rank
    must take part in the gathers; only the writer keeps the result)."""
    total_lengths, response_lengths = rollout_data["total_lengths"], rollout_data["response_lengths"]
    n = len(response_lengths)
    if len(total_lengths) != n:
        raise ValueError(f"total_lengths and response_lengths differ in length: {len(total_lengths)} and {n}.")
    restored = (
        {k: _to_cpu(v) for k, v in rollout_data.items() if k not in _CONTEXT_PARALLEL_FIELDS} if keep_restored else None
    )
    for key in _CONTEXT_PARALLEL_FIELDS:
        values = rollout_data.get(key)
        if values is None:
            continue
        if not isinstance(values, (list, tuple)) or len(values) != n:
            count = len(values) if isinstance(values, (list, tuple)) else "not a list or tuple"
            raise ValueError(f"CP-sharded field {key!r} must hold one tensor per sample: got {count}, expected {n}.")
        full_values = []
        for i, (value, total, response) in enumerate(zip(values, total_lengths, response_lengths, strict=True)):
            if not torch.is_tensor(value):
                raise TypeError(f"CP-sharded field {key!r} sample {i} must be a tensor, got {type(value).__name__}.")
            full = gather_tensor(value, int(total), int(response)).detach()
            if full.size(0) != response:
                raise ValueError(f"Restored field {key!r} sample {i} has length {full.size(0)}, expected {response}.")
            if keep_restored:
                full_values.append(full.cpu())
        if restored is not None:
            restored[key] = full_values
    return restored


def _is_per_sample(value: Any, n: int) -> bool:
    if torch.is_tensor(value):
        return value.dim() >= 1 and value.size(0) == n
    return isinstance(value, (list, tuple)) and len(value) == n


def _shard_samples(shard: dict[str, Any], whole_batch: dict[str, Any]) -> tuple[list[dict], dict[str, Any]]:
    data, dp_rank = shard["rollout_data"], shard["data_parallel_rank"]
    n = len(data["response_lengths"])
    layout: dict[str, Any] = {"rank": shard["rank"], "data_parallel_rank": dp_rank}
    for column in _ID_COLUMNS:
        layout[column] = list(data[column]) if data.get(column) is not None else None
    columns = {}
    for key, value in data.items():
        if key in _ID_COLUMNS:
            continue
        if key in _WHOLE_BATCH_FIELDS:
            whole_batch.setdefault(key, value)
        elif key in _LAYOUT_FIELDS or not _is_per_sample(value, n):
            layout[key] = value
        else:
            columns[key] = value
    samples = []
    for i in range(n):
        sample: dict[str, Any] = {"data_parallel_rank": dp_rank}
        for column, scalar in _ID_COLUMNS.items():
            if data.get(column) is not None:
                sample[scalar] = data[column][i]
        sample.update({key: column[i] for key, column in columns.items()})
        samples.append(sample)
    return samples, layout


def _build_dump_payload(dp_shards: list[dict[str, Any]], *, rollout_id: int, writer_rank: int) -> dict[str, Any]:
    """slime's format 2: samples sorted by their place in the rollout dump (`rollout_position`,
    else `sample_index`, else gather order), the per-rank layouts, the whole-batch fields."""
    samples, layouts, whole_batch = [], [], {}
    for shard in dp_shards:
        shard_samples, layout = _shard_samples(shard, whole_batch)
        samples.extend(shard_samples)
        layouts.append(layout)
    order = next(
        (k for k in ("rollout_position", "sample_index") if samples and all(s.get(k) is not None for s in samples)),
        None,
    )
    if order is not None:
        samples.sort(key=lambda s: s[order])
    else:
        logger.warning("train debug dump: samples carry neither partition nor sample_index; kept in gather order")
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": writer_rank,
        "samples": samples,
        "dp_shards": layouts,
        **whole_batch,
    }


def save_debug_train_data(args: Namespace, *, rollout_id: int, rollout_data: dict[str, Any]) -> None:
    """`--save-debug-train-data PATTERN` (`{rollout_id}`, `{rank}`): rank 0 gathers every rank's
    batch and writes the dump; nothing without the option."""
    path_template = args.save_debug_train_data
    if path_template is None:
        return
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local = {"rank": rank, "data_parallel_rank": rank, "rollout_data": _to_cpu(rollout_data)}
    if world == 1:
        shards = [local]
    else:
        shards = [None] * world if rank == 0 else None
        dist.gather_object(local, shards, dst=0)
    if rank != 0:
        return
    path = Path(path_template.format(rollout_id=rollout_id, rank=rank))
    logger.info("Save debug train data from %s DP shard(s) to %s", world, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(_build_dump_payload(shards, rollout_id=rollout_id, writer_rank=rank), path)
