"""slime's debug dumps: rollout data saved and replayed, train data saved, readable records.

* `--save-debug-rollout-data PATTERN`: after each rollout (before any filter or conversion), the
  rollout's samples go to `PATTERN.format(rollout_id=...)` as slime writes them: `torch.save` of
  `{"rollout_id": id, "samples": [sample.to_dict(), ...]}` (flattened; evaluation data as
  `eval_<id>`).
* `--load-debug-rollout-data PATTERN` reads them back instead of generating (slime's
  `load_debug_rollout_data`, its `--load-debug-rollout-data-subsample` rule included); the samples
  are regrouped by `group_index` (else in runs of `--n-samples-per-prompt`), so the replayed rollout
  turns into the very train data the original produced.
* `--save-debug-train-data PATTERN` (`{rollout_id}`, `{rank}`): one file per rollout holding every
  rank's samples with what the trainer computed for them (old/reference log-probs, advantages, ...).
* `--dump-details DIR` writes both under DIR and, next to each `.pt`, a `.jsonl` of per-sample
  records a person can read.
"""

from __future__ import annotations

import json
import logging
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

from slime.errors import SlimeError
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

# what a readable record of a rollout sample holds (the rest stays in the .pt)
_READABLE_SAMPLE_KEYS = (
    "index",
    "group_index",
    "prompt",
    "response",
    "label",
    "reward",
    "status",
    "response_length",
    "weight_versions",
)


def rollout_data_path(pattern: str, rollout_id: int | str) -> Path:
    return Path(pattern.format(rollout_id=rollout_id))


def save_rollout_data(args: Namespace, samples: list[Sample], rollout_id: int, evaluation: bool = False) -> None:
    """`--save-debug-rollout-data` (or `--dump-details`): the rollout's samples, slime's format."""
    if args.save_debug_rollout_data is None:
        return
    path = rollout_data_path(args.save_debug_rollout_data, ("eval_" if evaluation else "") + str(rollout_id))
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [s.to_dict() for s in samples]
    torch.save({"rollout_id": rollout_id, "samples": records}, path)
    if args.dump_details is not None:
        write_jsonl(
            path.with_suffix(".jsonl"),
            [{k: r.get(k) for k in _READABLE_SAMPLE_KEYS} | {"tokens": len(r.get("tokens") or [])} for r in records],
        )
    logger.info("saved %d samples of rollout %s to %s", len(records), rollout_id, path)


def load_rollout_data(args: Namespace, rollout_id: int) -> list[list[Sample]]:
    """`--load-debug-rollout-data`: one rollout's saved samples as groups, checked against this
    run's batch shape (a mismatch stops, naming the file and what differs)."""
    path = rollout_data_path(args.load_debug_rollout_data, rollout_id)
    samples = read_samples(path, rollout_id)
    ratio = args.load_debug_rollout_data_subsample
    if ratio is not None:  # slime's rule: the first and last halves of int(n * ratio) rows
        k = int(len(samples) * ratio)
        samples = samples[: k // 2] + samples[-k // 2 :] if k else []
    groups = regroup(samples, args.n_samples_per_prompt)
    check_batch_shape(args, groups, path, rollout_id)
    return groups


def read_samples(path: Path, rollout_id: int, option: str = "--load-debug-rollout-data") -> list[Sample]:
    if not path.is_file():
        raise SlimeError(f"{option}: no file {path} for rollout {rollout_id}")
    try:
        saved = torch.load(path, weights_only=True)  # plain types only: a data file never runs code
        records = saved["samples"]
        return [Sample.from_dict(r) for r in records]
    except Exception as e:
        raise SlimeError(
            f"{option}: {path} is not saved rollout data "
            f"({{'rollout_id', 'samples'}} from --save-debug-rollout-data): {type(e).__name__}: {e}"
        ) from e


def regroup(samples: list[Sample], n_samples_per_prompt: int) -> list[list[Sample]]:
    """Consecutive samples of one `group_index` form a group; without indices, runs of n."""
    if not samples:
        return []
    if any(s.group_index is None for s in samples):
        return [samples[i : i + n_samples_per_prompt] for i in range(0, len(samples), n_samples_per_prompt)]
    groups: list[list[Sample]] = [[samples[0]]]
    for s in samples[1:]:
        if s.group_index == groups[-1][-1].group_index:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def check_batch_shape(args: Namespace, groups: list[list[Sample]], path: Path, rollout_id: int) -> None:
    """The loaded rollout must be a batch this run can train on: the whole batch of
    `--rollout-batch-size` groups of `--n-samples-per-prompt` (or, subsampled, whole steps of
    `--global-batch-size`)."""
    n = sum(len(g) for g in groups)
    where = f"--load-debug-rollout-data {path} (rollout {rollout_id})"
    if args.load_debug_rollout_data_subsample is None:
        expected = args.rollout_batch_size * args.n_samples_per_prompt
        if n != expected:
            raise SlimeError(
                f"{where} holds {n} samples, but this run's rollout is --rollout-batch-size "
                f"{args.rollout_batch_size} x --n-samples-per-prompt {args.n_samples_per_prompt} "
                f"= {expected} samples"
            )
        sizes = sorted({len(g) for g in groups})
        if sizes != [args.n_samples_per_prompt]:
            raise SlimeError(
                f"{where} holds groups of {', '.join(map(str, sizes))} samples, but "
                f"--n-samples-per-prompt is {args.n_samples_per_prompt}"
            )
    elif n == 0 or n % args.global_batch_size:
        raise SlimeError(
            f"{where}: --load-debug-rollout-data-subsample {args.load_debug_rollout_data_subsample} "
            f"keeps {n} samples, not a whole number of optimizer steps of --global-batch-size "
            f"{args.global_batch_size}"
        )


def save_train_data(
    path_pattern: str, rollout_id: int, rank: int, samples: list[dict[str, Any]], readable: bool
) -> Path:
    """`--save-debug-train-data`: one file for the rollout with every rank's samples, by sample index."""
    path = Path(path_pattern.format(rollout_id=rollout_id, rank=rank))
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = sorted(samples, key=lambda s: s["sample_index"])
    torch.save({"rollout_id": rollout_id, "rank": rank, "samples": samples}, path)
    if readable:
        write_jsonl(path.with_suffix(".jsonl"), [_readable_train_record(s) for s in samples])
    return path


def _readable_train_record(sample: dict[str, Any]) -> dict[str, Any]:
    """Scalars as they are; per-token lists summarised (mean over the trained tokens, and length)."""
    mask = sample.get("loss_mask") or []
    out: dict[str, Any] = {}
    for key, value in sample.items():
        if key == "tokens":
            out["num_tokens"] = len(value)
        elif isinstance(value, list) and value and isinstance(value[0], float) and len(value) == len(mask):
            kept = [v for v, m in zip(value, mask, strict=True) if m]
            out[f"{key}_mean"] = sum(kept) / len(kept) if kept else None
        elif key != "loss_mask":
            out[key] = value
    out["trained_tokens"] = int(sum(mask))
    return out


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
