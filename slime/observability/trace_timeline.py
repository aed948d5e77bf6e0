"""The timeline of per-sample traces (slime.observability.trace_utils): Chrome trace-event JSON,
which https://ui.perfetto.dev and chrome://tracing open, one row per sample, grouped by prompt
group; spans as bars, events as marks, times in microseconds from the first event."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["chrome_trace", "write_chrome_trace", "save_rollout_trace", "chrome_trace_from_dump", "TRACES_DIR"]

TRACES_DIR = "traces"


def _carriers(samples: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for s in samples:
        trace = s.get("trace") if isinstance(s, dict) else getattr(s, "trace", None)
        if isinstance(trace, dict) and trace.get("events"):
            out.append(trace)
    return out


def _row_events(carrier: dict[str, Any], pid: int, tid: int, t0: float) -> list[dict[str, Any]]:
    def us(ts: float) -> float:
        return round((ts - t0) * 1e6, 3)

    events, open_spans = [], {}
    last = max(e["ts"] for e in carrier["events"])
    for e in carrier["events"]:
        kind = e.get("type")
        if kind == "span_start":
            open_spans[e.get("span_id")] = e
        elif kind == "span_end" and e.get("span_id") in open_spans:
            start = open_spans.pop(e["span_id"])
            args = {**start.get("attrs", {}), **e.get("attrs", {}), "attempt": start.get("attempt", 0)}
            events.append(
                {"ph": "X", "name": start["name"], "ts": us(start["ts"]), "dur": us(e["ts"]) - us(start["ts"])}
                | {"pid": pid, "tid": tid, "cat": "span", "args": args}
            )
        elif kind == "event":
            events.append(
                {"ph": "i", "s": "t", "name": e["name"], "ts": us(e["ts"]), "pid": pid, "tid": tid, "cat": "event"}
                | {"args": {**e.get("attrs", {}), "attempt": e.get("attempt", 0)}}
            )
    for start in open_spans.values():  # never closed (the process stopped inside it): up to the last event
        args = {**start.get("attrs", {}), "unfinished": True}
        events.append(
            {"ph": "X", "name": start["name"], "ts": us(start["ts"]), "dur": us(last) - us(start["ts"])}
            | {"pid": pid, "tid": tid, "cat": "span", "args": args}
        )
    return events


def chrome_trace(samples: Iterable[Any]) -> dict[str, Any]:
    """Chrome trace-event JSON of the samples' traces (Samples or `Sample.to_dict()` records): a
    process per prompt group, a thread (row) per sample, times in microseconds from the first event."""
    carriers = _carriers(samples)
    out: dict[str, Any] = {"traceEvents": [], "displayTimeUnit": "ms"}
    if not carriers:
        return out
    t0 = min(e["ts"] for c in carriers for e in c["events"])
    out["otherData"] = {"start_unix_s": t0, "samples": len(carriers)}
    named: set[int] = set()
    for row, carrier in enumerate(carriers):
        group, sample_id = carrier.get("group_id"), carrier.get("sample_id")
        pid = group if isinstance(group, int) else 0
        tid = sample_id if isinstance(sample_id, int) else row
        if pid not in named:
            named.add(pid)
            out["traceEvents"].append(
                {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"group {group}"}}
            )
        label = {"name": f"sample {sample_id}"}
        out["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": label})
        out["traceEvents"].extend(_row_events(carrier, pid, tid, t0))
    return out


def write_chrome_trace(samples: Iterable[Any], path: str | Path) -> Path | None:
    """Write `chrome_trace(samples)` to `path`; None (nothing written) when no sample has a trace."""
    trace = chrome_trace(samples)
    if not trace["traceEvents"]:
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(trace, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def save_rollout_trace(run_dir: str | Path, rollout_id: int | str, samples: Iterable[Any]) -> Path | None:
    """The rollout's timeline in `<run-dir>/traces/rollout_<id>.trace.json` (None: no traces)."""
    return write_chrome_trace(samples, Path(run_dir) / TRACES_DIR / f"rollout_{rollout_id}.trace.json")


def chrome_trace_from_dump(dump_path: str | Path, out_path: str | Path | None = None) -> Path | None:
    """The timeline of a `--save-debug-rollout-data` file, next to it as `<name>.trace.json`."""
    import torch

    dump_path = Path(dump_path)
    records = torch.load(dump_path, weights_only=True)["samples"]
    return write_chrome_trace(records, out_path or dump_path.with_suffix(".trace.json"))
