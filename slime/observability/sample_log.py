"""The per-rollout sample log that `slime report` shows in its rollout browser.

After each rollout the RolloutManager writes the first `--report-groups-per-rollout` groups (every
sample of each, FAILED ones included) to `<run-dir>/samples/[<stage>/]rollout_<id>.json`, and after
each evaluation the first groups of every eval data set to `.../eval_<id>.json` (only into a run
directory that exists: the training loop creates it first). The trainer adds
the advantages it computed for the logged samples it trained on in `rollout_<id>.adv.rank<r>.json`
(one file per training rank; no collective). A file holds:

    {"rollout_id": 3, "stage": null, "evaluation": false, "num_groups": 8, "num_samples": 32,
     "groups": [{"group": 0, "dataset": null, "samples": [SAMPLE, ...]}, ...]}

    SAMPLE = {"train_index": position in the rollout's train data (the trainer's sample index),
              "index", "group_index", "prompt" (text or chat messages), "label", "response",
              "prompt_length", "response_length", "response_ids", "response_tokens" (each id decoded
              alone; null without a tokenizer), "loss_mask", "log_probs" (engine, per response
              token, or null), "reward" (scalar, null if none), "reward_raw" (as the reward model
              returned it), "status", "weight_versions", "turns" (multi-turn spans from
              metadata["turns"], or null), "error" (metadata["error"] of a FAILED sample), "stop_reason"}

The log stays small by sampling: a fixed number of groups per rollout, whatever the batch size.
Files are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import sys
from argparse import Namespace
from functools import lru_cache
from pathlib import Path
from typing import Any

from slime.observability.report_tokens import token_texts
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

__all__ = [
    "RUN_FACTS_FILE",
    "SAMPLES_DIR",
    "advantages_path",
    "read_sample_log",
    "rollout_log_path",
    "run_facts",
    "sample_record",
    "samples_dir",
    "write_advantages",
    "write_eval_samples",
    "write_rollout_samples",
]

SAMPLES_DIR = "samples"
RUN_FACTS_FILE = "run_facts.json"
FACT_PACKAGES = ("torch", "transformers", "ray", "slime-rl", "sglang", "sglang-router")


def samples_dir(run_dir: str | Path, stage: str | None = None) -> Path:
    d = Path(run_dir) / SAMPLES_DIR
    return d / stage if stage else d


def rollout_log_path(run_dir: str | Path, rollout_id: int, stage: str | None = None, evaluation: bool = False) -> Path:
    name = f"{'eval' if evaluation else 'rollout'}_{int(rollout_id):06d}.json"
    return samples_dir(run_dir, stage) / name


def advantages_path(run_dir: str | Path, rollout_id: int, rank: int, stage: str | None = None) -> Path:
    return samples_dir(run_dir, stage) / f"rollout_{int(rollout_id):06d}.adv.rank{int(rank)}.json"


def _atomic_write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str), encoding="utf-8")
    os.replace(tmp, path)


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _plain(value: Any) -> Any:
    """JSON-safe copy: tensors as lists, non-finite floats as null, unknown objects as text."""
    if hasattr(value, "tolist") and hasattr(value, "dtype"):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


@lru_cache(maxsize=4)
def _tokenizer(path: str | None):
    if not path:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any loading failure: the log still holds the ids
        logger.warning("sample log: no tokenizer from %s (%s: %s); token strings left out", path, type(e).__name__, e)
        return None


def _token_strings(tokenizer: Any, ids: list[int]) -> list[str] | None:
    if tokenizer is None or not ids:
        return None if tokenizer is None else []
    try:  # a byte-level piece that is not whole UTF-8 alone is logged as its bytes (`<0xE2>`), not as �
        return token_texts(tokenizer, ids)
    except Exception:  # noqa: BLE001 - ids this tokenizer cannot decode: the log still holds the ids
        return None


def _reward(args: Namespace, s: Sample) -> float | None:
    if s.reward is None:
        return None
    try:
        return _finite(s.get_reward_value(args))
    except (KeyError, TypeError, ValueError):  # a dict reward without --reward-key's entry, or not a number
        return None


def sample_record(args: Namespace, s: Sample, train_index: int | None, tokenizer: Any = None) -> dict[str, Any]:
    """One sample as the report shows it (see the module doc)."""
    n = int(s.response_length or 0)
    tokens = [int(t) for t in (s.tokens or [])]
    response_ids = tokens[len(tokens) - n :] if n else []
    mask = [int(m) for m in s.loss_mask] if s.loss_mask is not None else [1] * n
    meta = s.metadata if isinstance(s.metadata, dict) else {}
    status = s.status.value if isinstance(s.status, Sample.Status) else str(s.status)
    return {
        "train_index": train_index,
        "index": s.index,
        "group_index": s.group_index,
        "prompt": _plain(s.prompt),
        "label": _plain(s.label),
        "response": s.response,
        "prompt_length": len(tokens) - n,
        "response_length": n,
        "response_ids": response_ids,
        "response_tokens": _token_strings(tokenizer, response_ids),
        "loss_mask": mask,
        "log_probs": [_finite(x) for x in s.rollout_log_probs] if s.rollout_log_probs is not None else None,
        "reward": _reward(args, s),
        "reward_raw": _plain(s.reward),
        "status": status,
        "remove_sample": bool(s.remove_sample),
        "weight_versions": [str(v) for v in (s.weight_versions or [])],
        "turns": _plain(meta.get("turns")) if meta.get("turns") else None,
        "error": _plain(meta.get("error")),
        "stop_reason": _plain(meta.get("stop_reason")),
    }


def run_facts() -> dict[str, Any]:
    """Where the run ran: package versions, Python, OS, CPUs, GPUs (what the report's facts show)."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in FACT_PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    gpus = None
    if "torch" in sys.modules:  # never import torch just for this
        torch = sys.modules["torch"]
        try:
            if torch.cuda.is_available():
                gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        except Exception:  # noqa: BLE001 - a broken CUDA setup: the facts say no GPUs, the run goes on
            gpus = None
    return {
        "versions": versions,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
    }


def _write_facts_once(run_dir: Path) -> None:
    path = run_dir / RUN_FACTS_FILE
    if not path.exists():
        try:
            _atomic_write_json(path, run_facts())
        except OSError as e:
            logger.warning("could not write %s: %s", path, e)


def _run_dir_exists(args: Namespace) -> bool:
    """The log goes into a run directory the run made (slime.train creates it before the rollout
    side starts); a manager driven without one (a tool, a unit test) writes nothing."""
    return args.run_dir is not None and Path(args.run_dir).is_dir()


def _groups_payload(
    args: Namespace, groups: list[list[Sample]], limit: int, dataset: str | None = None, start: int = 0
) -> list[dict[str, Any]]:
    tokenizer = _tokenizer(args.hf_checkpoint)
    out = []
    offsets = [0]
    for g in groups:
        offsets.append(offsets[-1] + len(g))
    for gi, group in enumerate(groups[:limit]):
        out.append(
            {
                "group": start + gi,
                "dataset": dataset,
                "samples": [
                    sample_record(args, s, offsets[gi] + j if dataset is None else None, tokenizer)
                    for j, s in enumerate(group)
                ],
            }
        )
    return out


def write_rollout_samples(args: Namespace, groups: list[list[Sample]], rollout_id: int) -> Path | None:
    """The first `--report-groups-per-rollout` groups of a training rollout (0: nothing written).
    `groups` as generated, in train-data order, so `train_index` is the trainer's sample index."""
    limit = args.report_groups_per_rollout
    if not limit or not _run_dir_exists(args):
        return None
    run_dir = Path(args.run_dir)
    path = rollout_log_path(run_dir, rollout_id, args.stage)
    try:
        _write_facts_once(run_dir)
        payload = {
            "rollout_id": int(rollout_id),
            "stage": args.stage,
            "evaluation": False,
            "num_groups": len(groups),
            "num_samples": sum(len(g) for g in groups),
            "groups": _groups_payload(args, groups, limit),
        }
        _atomic_write_json(path, payload)
    except Exception as e:  # noqa: BLE001 - the log is for people; a failure to write it never stops training
        logger.warning("sample log of rollout %s not written (%s: %s)", rollout_id, type(e).__name__, e)
        return None
    return path


def _eval_groups(samples: list[Sample]) -> list[list[Sample]]:
    groups: list[list[Sample]] = []
    for s in samples:
        if groups and s.group_index is not None and groups[-1][-1].group_index == s.group_index:
            groups[-1].append(s)
        else:
            groups.append([s])
    return groups


def write_eval_samples(args: Namespace, results: dict[str, Any], rollout_id: int) -> Path | None:
    """The first `--report-groups-per-rollout` groups of each eval data set (`results` as the eval
    rollout returns them: name -> {"samples": [...], ...})."""
    limit = args.report_groups_per_rollout
    if not limit or not _run_dir_exists(args):
        return None
    path = rollout_log_path(args.run_dir, rollout_id, args.stage, evaluation=True)
    try:
        groups_out: list[dict[str, Any]] = []
        n_groups = n_samples = 0
        for name, res in results.items():
            samples = list((res or {}).get("samples") or [])
            groups = _eval_groups(samples)
            n_groups += len(groups)
            n_samples += len(samples)
            groups_out += _groups_payload(args, groups, limit, dataset=str(name), start=0)
        _atomic_write_json(
            path,
            {
                "rollout_id": int(rollout_id),
                "stage": args.stage,
                "evaluation": True,
                "num_groups": n_groups,
                "num_samples": n_samples,
                "groups": groups_out,
            },
        )
    except Exception as e:  # noqa: BLE001 - as above: a failure to write the log never stops training
        logger.warning("sample log of evaluation %s not written (%s: %s)", rollout_id, type(e).__name__, e)
        return None
    return path


def write_advantages(args: Namespace, rollout_id: int, data: dict[str, Any], mine: list[int], rank: int) -> Path | None:
    """Per-token advantages of the logged samples this rank trained on (`data["advantages"]`:
    train index -> tensor), next to the rollout's sample log; nothing when that log is absent."""
    if not args.report_groups_per_rollout or args.run_dir is None or "advantages" not in data:
        return None
    log = rollout_log_path(args.run_dir, rollout_id, args.stage)
    try:
        logged = {
            s["train_index"]
            for g in json.loads(log.read_text(encoding="utf-8"))["groups"]
            for s in g["samples"]
            if s.get("train_index") is not None
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None
    adv = data["advantages"]
    out = {str(i): [_finite(x) for x in _plain(adv[i])] for i in mine if i in logged and i in adv}
    if not out:
        return None
    path = advantages_path(args.run_dir, rollout_id, rank, args.stage)
    try:
        _atomic_write_json(path, {"rollout_id": int(rollout_id), "rank": int(rank), "advantages": out})
    except OSError as e:
        logger.warning("advantages of rollout %s not written: %s", rollout_id, e)
        return None
    return path


def read_sample_log(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the log, None) or (None, why it could not be read)."""
    p = Path(path)
    try:
        obj = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return None, f"{p}: not readable ({type(e).__name__}: {e})"
    if not isinstance(obj, dict) or not isinstance(obj.get("groups"), list):
        return None, f"{p}: not a sample log (no 'groups' list)"
    return obj, None
