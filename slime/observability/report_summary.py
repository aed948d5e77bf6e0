"""The summary at the top of `slime report`'s page: per stage of the run, the eval scores (first,
final, best), the reward trend, where the wall time went, and the number of rollouts.

Read from metrics.jsonl rows (slime.observability.metrics): `time` is seconds since the stage's
metrics logger was created (slime.train creates it right after writing args.json, before Ray, the
engines and the trainer start), so the first row's `time` less that row's own step is the start-up.
A resumed stage starts a new logger: its `time` goes back to 0, which starts a new segment.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

__all__ = [
    "EVAL_MAIN_SUFFIXES",
    "TIME_PHASES",
    "TREND_KEYS",
    "fmt_seconds",
    "fmt_value",
    "render_summary",
    "stage_summaries",
    "stage_wall",
]

# The score shown per eval set: eval/<name> (the mean reward, the key the console and plots show),
# else the first of these a custom eval logs
EVAL_MAIN_SUFFIXES = ("", "/score", "/accuracy", "/acc", "/pass@1")
TREND_KEYS = ("rollout/raw_reward", "train/sft_loss", "train/loss")  # an SFT stage has no reward
# (phase, keys by preference): the loop's own waits first (they add up to perf/step_time; an async
# run's rollout time is mostly hidden behind training), else the phase's own timer
TIME_PHASES = (
    ("rollout", ("perf/rollout_wait_time", "perf/rollout_time")),
    ("train", ("perf/train_wait_time", "perf/train_time")),
    ("weight sync", ("perf/sync_wait_time", "perf/update_weights_time")),
    ("eval", ("perf/eval_time",)),
)
LAST_N = 5  # the reward trend's "mean of the last N rollouts"
_PASSRATE_NAME = re.compile(r"-pass@\d+$")  # eval/<name>-pass@k (--log-passrate), not a data set


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _by_stage(records: list[dict[str, Any]], xs: list[int | None]) -> dict[str | None, list[tuple[int, dict]]]:
    """stage -> [(x, row)] in file order, stages in order of appearance."""
    out: dict[str | None, list[tuple[int, dict]]] = {}
    for r, x in zip(records, xs, strict=True):
        if x is not None:
            out.setdefault(r.get("stage"), []).append((x, r))
    return out


def _eval_sets(rows: list[dict[str, Any]]) -> list[str]:
    names = {k[len("eval/") :].split("/")[0] for r in rows for k in r if k.startswith("eval/")}
    return sorted(n for n in names if n and not _PASSRATE_NAME.search(n))


def _eval_summary(name: str, rows: list[tuple[int, dict]]) -> dict[str, Any] | None:
    """First, final and best (highest) value of the eval set's main key, with their rollout ids."""
    for suffix in EVAL_MAIN_SUFFIXES:
        key = f"eval/{name}{suffix}"
        pts = [(r.get("rollout_id"), float(r[key])) for _, r in rows if _num(r.get(key))]
        if pts:
            best = max(pts, key=lambda p: p[1])  # the earliest of equal bests
            return {
                "set": name,
                "key": key,
                "points": len(pts),
                "first": pts[0][1],
                "first_step": pts[0][0],
                "final": pts[-1][1],
                "final_step": pts[-1][0],
                "best": best[1],
                "best_step": best[0],
            }
    return None


def _trend(rows: list[tuple[int, dict]]) -> dict[str, Any] | None:
    for key in TREND_KEYS:
        vals = [float(r[key]) for _, r in rows if _num(r.get(key))]
        if vals:
            last = vals[-LAST_N:]
            return {
                "key": key,
                "first": vals[0],
                "last": vals[-1],
                "last_mean": sum(last) / len(last),
                "last_n": len(last),
            }
    return None


def _phase_keys(rows: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(phase, the key its time is summed from, or None when the stage logged none of its keys)."""
    return [(phase, next((k for k in keys if any(_num(r.get(k)) for r in rows)), None)) for phase, keys in TIME_PHASES]


def _segments(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows of each start of the stage (a resumed stage's logger counts `time` from 0 again)."""
    segs: list[list[dict[str, Any]]] = []
    last = math.inf
    for r in rows:
        if not _num(r.get("time")):
            continue
        t = float(r["time"])
        if t < last:
            segs.append([])
        segs[-1].append(r)
        last = t
    return segs


def _own_time(row: dict[str, Any], keys: list[str]) -> float:
    """The seconds a row's own step (or evaluation) took: perf/step_time, else its phases' sum."""
    if _num(row.get("perf/step_time")):
        return float(row["perf/step_time"])
    return sum(float(row[k]) for k in keys if _num(row.get(k)))


def stage_wall(rows: list[dict[str, Any]]) -> tuple[float | None, float | None, int]:
    """(wall seconds, start-up seconds, number of starts) of one stage's rows (in file order)."""
    keys = [k for _, k in _phase_keys(rows) if k]
    segs = _segments(rows)
    if not segs:
        return None, None, 0
    wall = sum(float(s[-1]["time"]) for s in segs)
    startup = sum(max(0.0, float(s[0]["time"]) - _own_time(s[0], keys)) for s in segs)
    return wall, startup, len(segs)


def _stage_summary(stage: str | None, pts: list[tuple[int, dict]]) -> dict[str, Any]:
    rows = [r for _, r in pts]
    ordered = sorted(pts, key=lambda p: p[0])  # by step; file order breaks ties
    phases = _phase_keys(rows)
    wall, startup, starts = stage_wall(rows)
    phase_s: list[dict[str, Any]] = [
        {"phase": p, "key": k, "seconds": sum(float(r[k]) for r in rows if _num(r.get(k))) if k else None}
        for p, k in phases
    ]
    accounted = (startup or 0.0) + sum(p["seconds"] or 0.0 for p in phase_s)
    ids = {int(r["rollout_id"]) for r in rows if _num(r.get("rollout_id"))}
    evals = [e for name in _eval_sets(rows) if (e := _eval_summary(name, ordered))]
    return {
        "stage": stage,
        "rows": len(rows),
        "rollouts": sum(1 for i in ids if i >= 1),  # row k + 1 is rollout k; row 0: the eval before training
        "starts": starts,
        "wall_s": wall,
        "startup_s": startup,
        "phases": phase_s,
        "other_s": None if wall is None else max(0.0, wall - accounted),
        "trend": _trend(ordered),
        "evals": evals,
    }


def stage_summaries(records: list[dict[str, Any]], xs: list[int | None]) -> list[dict[str, Any]]:
    """One summary per stage, in order of appearance (see the module doc); `xs`: each row's global step."""
    return [_stage_summary(stage, pts) for stage, pts in _by_stage(records, xs).items()]


# ---- HTML -------------------------------------------------------------------------------------------


def fmt_value(v: float | None) -> str:
    """4 significant digits; small and big numbers in exponent form."""
    if v is None:
        return "–"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6):
        return f"{v:.3e}"
    return f"{v:.4g}"


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def _at(v: float, step: Any) -> str:
    return f"{fmt_value(v)} <span class='at'>(step {html.escape(str(step))})</span>"


def _eval_table(evals: list[dict[str, Any]]) -> str:
    if not evals:
        return "<div class='empty'>no eval scores in this stage</div>"
    rows = "".join(
        f"<tr><td>{html.escape(e['set'])}</td><td><code>{html.escape(e['key'])}</code>"
        f"{' (mean reward)' if e['key'] == 'eval/' + e['set'] else ''}</td>"
        f"<td>{_at(e['first'], e['first_step'])}</td><td class='final'>{_at(e['final'], e['final_step'])}</td>"
        f"<td>{_at(e['best'], e['best_step'])}</td><td>{e['points']}</td></tr>"
        for e in evals
    )
    head = "<tr><th>eval set</th><th>score shown</th><th>first</th><th>final</th><th>best</th><th>evals</th></tr>"
    return f"<table class='kv evals'>{head}{rows}</table>"


def _trend_line(t: dict[str, Any] | None) -> str:
    if t is None:
        return "<div class='trend empty'>no reward or loss logged</div>"
    arrow = "▲" if t["last"] > t["first"] else "▼" if t["last"] < t["first"] else "="
    return (
        f"<div class='trend'><code>{html.escape(t['key'])}</code>: {fmt_value(t['first'])} → "
        f"<b>{fmt_value(t['last'])}</b> {arrow} (first → last); mean of the last {t['last_n']}: "
        f"<b>{fmt_value(t['last_mean'])}</b></div>"
    )


def _time_parts(s: dict[str, Any]) -> list[tuple[str, float, str]]:
    """(name, seconds, what it is) of the wall time's parts that are known."""
    parts = [
        ("start-up", s["startup_s"], "before the first step or evaluation: Ray, engines, model load, first weight push")
    ]
    parts += [(p["phase"], p["seconds"], f"sum of {p['key']}") for p in s["phases"] if p["key"]]
    parts.append(("other", s["other_s"], "the rest: saves, offload, bookkeeping"))
    return [(n, v, why) for n, v, why in parts if v is not None]


def _time_block(s: dict[str, Any]) -> str:
    if s["wall_s"] is None:
        return "<div class='empty'>no timed rows</div>"
    parts = _time_parts(s)
    total = max(s["wall_s"], sum(v for _, v, _ in parts), 1e-9)
    bar = "".join(
        f"<span class='seg t-{i}' style='width:{100 * v / total:.2f}%' title='{html.escape(n)}: "
        f"{fmt_seconds(v)} ({html.escape(why)})'></span>"
        for i, (n, v, why) in enumerate(parts)
    )
    text = " · ".join(
        f"<span title='{html.escape(why)}'><i class='t-{i}'></i>{html.escape(n)} {fmt_seconds(v)}</span>"
        for i, (n, v, why) in enumerate(parts)
    )
    return f"<div class='timebar'>{bar}</div><div class='timetext'>{text}</div>"


def _stage_block(s: dict[str, Any]) -> str:
    name = "Run" if s["stage"] is None else f"Stage {s['stage']}"
    starts = f" · {s['starts']} starts (resumed)" if s["starts"] > 1 else ""
    head = f"{html.escape(name)} · {s['rollouts']} rollouts · wall {fmt_seconds(s['wall_s'])}{starts}"
    stage = html.escape(str(s["stage"] or ""))
    return (
        f"<div class='stage-sum' data-stage='{stage}'><h3>{head}</h3>"
        f"{_eval_table(s['evals'])}{_trend_line(s['trend'])}{_time_block(s)}</div>"
    )


def render_summary(summaries: list[dict[str, Any]]) -> str:
    """The summary section's HTML (static: it needs no script)."""
    body = "".join(_stage_block(s) for s in summaries) or "<div class='empty'>no metrics rows yet</div>"
    return f"<section id='summary'><h2>Summary</h2>{body}</section>"
