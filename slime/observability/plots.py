"""Plot a run's ``metrics.jsonl``: mean reward and every ``eval/<name>`` over the global step.

Uses matplotlib's Agg canvas directly (no pyplot, no global backend switch), so it is safe in
headless processes and threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slime.observability.metrics import read_metrics

__all__ = ["plot_run", "global_steps", "REWARD_KEY"]

REWARD_KEY = "rollout/raw_reward"


def global_steps(records: Sequence[dict[str, Any]]) -> list[int | None]:
    """x value of each record: its ``global_step``, else derived from ``rollout_id`` and stages.

    When ``global_step`` is missing, a record whose stage differs from the previous record's and
    whose ``rollout_id`` does not move past the last step continues after it (as MetricsLogger does).
    Records with neither field get None.
    """
    xs: list[int | None] = []
    offset = 0
    last_x: int | None = None
    last_stage: Any = object()
    for r in records:
        gs = r.get("global_step")
        rid = r.get("rollout_id")
        stage = r.get("stage")
        if isinstance(gs, (int, float)):
            x = int(gs)
            if isinstance(rid, (int, float)):
                offset = x - int(rid)
        elif isinstance(rid, (int, float)):
            if stage != last_stage and last_x is not None and int(rid) + offset <= last_x:
                offset = last_x + 1 - int(rid)
            x = int(rid) + offset
        else:
            xs.append(None)
            continue
        xs.append(x)
        last_x = x if last_x is None else max(last_x, x)
        last_stage = stage
    return xs


def _series(records, xs, key: str) -> tuple[list[int], list[float]]:
    """(x, y) of ``key`` over the records that have a finite value for it, sorted by x."""
    pts = []
    for r, x in zip(records, xs, strict=True):
        v = r.get(key)
        if x is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        pts.append((x, float(v)))
    pts.sort(key=lambda p: p[0])
    return [p[0] for p in pts], [p[1] for p in pts]


def _stage_starts(records, xs) -> list[tuple[int, str]]:
    """(first x, stage name) for each stage change, in order."""
    starts: list[tuple[int, str]] = []
    prev: Any = object()
    for r, x in zip(records, xs, strict=True):
        stage = r.get("stage")
        if x is None or stage is None:
            continue
        if stage != prev:
            starts.append((x, str(stage)))
            prev = stage
    return starts


def plot_run(metrics_path: str | Path, out_png: str | Path, title: str | None = None) -> Path:
    """Write a two-panel PNG: ``rollout/raw_reward`` per step (top) and each ``eval/<name>`` (bottom).

    ``metrics_path`` is a ``metrics.jsonl`` or the run directory holding it. The x axis is the
    global step across stages; each stage start is a dashed vertical line labelled with the stage.
    Missing series leave a "no data" note instead of failing. Returns ``out_png``.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazily: 0.6 s to import, used once at the end
    from matplotlib.figure import Figure

    records = read_metrics(metrics_path)
    xs = global_steps(records)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)

    fig = Figure(figsize=(9, 6.5), dpi=100)
    FigureCanvasAgg(fig)
    ax_r, ax_e = fig.subplots(2, 1, sharex=True)

    rx, ry = _series(records, xs, REWARD_KEY)
    if rx:
        ax_r.plot(rx, ry, "-", marker="." if len(rx) < 60 else None, color="tab:blue", label="mean reward")
        ax_r.legend(loc="best", fontsize="small")
    else:
        ax_r.text(0.5, 0.5, f"no {REWARD_KEY} data", ha="center", va="center", transform=ax_r.transAxes)
    ax_r.set_ylabel("mean reward")
    ax_r.grid(True, alpha=0.3)

    # Only the headline score of each eval set (`eval/<name>`), not its extra statistics.
    eval_keys = sorted({k for r in records for k in r if k.startswith("eval/") and k.count("/") == 1})
    plotted = 0
    for key in eval_keys:
        ex, ey = _series(records, xs, key)
        if ex:
            ax_e.plot(ex, ey, "-o", markersize=4, label=key[len("eval/") :])
            plotted += 1
    if plotted:
        ax_e.legend(loc="best", fontsize="small")
    else:
        ax_e.text(0.5, 0.5, "no eval/* data", ha="center", va="center", transform=ax_e.transAxes)
    ax_e.set_ylabel("eval score")
    ax_e.set_xlabel("global step")
    ax_e.grid(True, alpha=0.3)

    for x, name in _stage_starts(records, xs):
        for ax in (ax_r, ax_e):
            ax.axvline(x, color="gray", linestyle="--", linewidth=1)
        ax_r.annotate(
            name,
            xy=(x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -3),
            textcoords="offset points",
            va="top",
            fontsize="small",
            color="dimgray",
        )

    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, format="png")
    return out
