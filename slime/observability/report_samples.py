"""The rollout browser's data for `slime report`: the sample logs a run wrote under
<run-dir>/samples (stage folders too), each rollout's advantages merged in, thinned evenly past a
count or size, and byte-level tokens of older logs shown as bytes with the run's tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from slime.observability.report_tokens import load_tokenizer, needs_repair, repair_sample_tokens
from slime.observability.sample_log import SAMPLES_DIR, read_sample_log

_LOG_NAME = re.compile(r"^(rollout|eval)_(-?\d+)\.json$")  # eval_-00001: the eval before training
_ADV_NAME = re.compile(r"^rollout_(\d+)\.adv\.rank(\d+)\.json$")


def _evenly(items: list[int], n: int) -> list[int]:
    """n of items, evenly spaced, first and last included (n == 1: the last)."""
    if n >= len(items):
        return list(items)
    if n <= 1:
        return [items[-1]]
    return [items[round(j * (len(items) - 1) / (n - 1))] for j in range(n)]


def read_json(path: Path, notes: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        notes.append(f"{path.name}: not readable ({type(e).__name__}: {e}); left out")
        return None


def _checkpoint(args_json: dict[str, dict[str, Any]], stage: str | None) -> str | None:
    """The --hf-checkpoint of a stage (its args file first, then any)."""
    names = [f"args.{stage}.json" if stage else "args.json", "args.json", *args_json]
    return next((v for n in names if isinstance(v := args_json.get(n, {}).get("hf_checkpoint"), str)), None)


def _repair_tokens(groups: list[dict[str, Any]], checkpoint: str | None) -> int:
    """Show byte-level tokens that the log holds as "�" as their bytes (report_tokens); returns how
    many samples still read "�" (no tokenizer to re-derive them)."""
    bad = [s for g in groups for s in g.get("samples") or [] if needs_repair(s)]
    if not bad:
        return 0
    tokenizer = load_tokenizer(checkpoint)
    return sum(not repair_sample_tokens(s, tokenizer) for s in bad)


def _find_sample_logs(
    base: Path,
) -> tuple[list[tuple[str | None, str, int, Path]], dict[tuple[str | None, int], list[Path]]]:
    """The sample logs under `base` (stage folders too) as (stage, kind, rollout id, file), in order,
    and each rollout's advantage files."""
    found: list[tuple[str | None, str, int, Path]] = []
    adv_files: dict[tuple[str | None, int], list[Path]] = {}
    for d in [base, *sorted(p for p in base.iterdir() if p.is_dir())]:
        stage = None if d == base else d.name
        for f in sorted(d.iterdir()):
            m = _LOG_NAME.match(f.name)
            if m:
                found.append((stage, m.group(1), int(m.group(2)), f))
                continue
            m = _ADV_NAME.match(f.name)
            if m:
                adv_files.setdefault((stage, int(m.group(1))), []).append(f)
    found.sort(key=lambda t: (t[0] or "", t[2], t[1]))
    return found, adv_files


def sample_logs(
    run_dir: Path,
    notes: list[str],
    max_rollouts: int | None,
    max_bytes: int,
    args_json: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every sample log under <run_dir>/samples (stage folders too), advantages merged in, thinned
    evenly (first and last kept) past `max_rollouts` or `max_bytes`; byte-level tokens shown as bytes."""
    args_json = args_json or {}
    base = run_dir / SAMPLES_DIR
    if not base.is_dir():
        return []
    found, adv_files = _find_sample_logs(base)
    sizes = [f.stat().st_size for *_, f in found]
    keep = list(range(len(found)))
    limit = len(found) if max_rollouts is None else max(1, max_rollouts)
    if len(keep) > limit:
        keep = _evenly(keep, limit)
    while len(keep) > 1 and sum(sizes[i] for i in keep) > max_bytes:
        total = sum(sizes[i] for i in keep)
        keep = _evenly(keep, min(len(keep) - 1, max(1, len(keep) * max_bytes // max(total, 1))))
    if len(keep) < len(found):
        notes.append(
            f"{len(found)} sample logs in {base}; {len(keep)} are embedded (evenly spaced, the last "
            f"included; --max-rollouts / size limit). The others stay on disk as JSON."
        )
    logs = []
    unrepaired = 0
    for i in keep:
        stage, kind, rid, f = found[i]
        obj, why = read_sample_log(f)
        if obj is None:
            notes.append(f"{why}; left out")
            continue
        adv: dict[str, Any] = {}
        if kind == "rollout":
            for af in adv_files.get((stage, rid), []):
                a = read_json(af, notes)
                if isinstance(a, dict) and isinstance(a.get("advantages"), dict):
                    adv.update(a["advantages"])
        unrepaired += _repair_tokens(obj["groups"], _checkpoint(args_json, stage))
        n_failed = 0
        for g in obj["groups"]:
            for s in g.get("samples") or []:
                ti = s.get("train_index")
                if ti is not None and str(ti) in adv:
                    s["advantages"] = adv[str(ti)]
                n_failed += s.get("status") == "failed"
                if isinstance(s.get("label"), (dict, list)):  # a structured label, shown as its JSON text
                    s["label"] = json.dumps(s["label"], ensure_ascii=False)
        logs.append(
            {
                "key": f"{stage or ''}:{kind}:{rid}",
                "stage": stage,
                "kind": kind,
                "rollout_id": rid,
                "num_groups": obj.get("num_groups"),
                "num_samples": obj.get("num_samples"),
                "num_failed_logged": n_failed,
                "has_advantages": bool(adv),
                "groups": obj["groups"],
            }
        )
    if unrepaired:
        notes.append(
            f"{unrepaired} logged samples have tokens that read \u201c\ufffd\u201d: pieces of a character "
            "split into bytes (byte-level BPE); the run's tokenizer (--hf-checkpoint) is not there to show "
            "their bytes"
        )
    return logs
