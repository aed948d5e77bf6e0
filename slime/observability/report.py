"""`slime report RUN_DIR`: one self-contained HTML file that shows a run.

    slime report runs/20260101-120000            # writes runs/20260101-120000/report.html
    slime report RUN_DIR --output /tmp/r.html --max-rollouts 50

The file opens from disk (no server, no network: its CSS, JS and SVG are inline) and holds

* a summary on top, per stage (report_summary): first / final / best score of each eval set, the
  reward trend, the wall time split into start-up, rollout, train, weight sync and eval, the rollouts;
* curves over the step (each metrics row's rollout id; the global step across the stages of a
  run): reward (and passrate/*), every eval metric (pass@k included), response length,
  truncation ratio, pg_clipfrac, ppo_kl, entropy, grad norm, train/rollout log-prob difference,
  the step time split into rollout / train / weight sync / eval, and the staleness of async modes;
  drag to zoom (all curves together), double-click to reset, hover for values; any other metric
  from a menu. Only charts of metrics the run logged are drawn (a synchronous run's staleness, 0
  throughout, is none); tick labels carry the decimals their step needs (report_ticks);
* a rollout browser over the sample log (slime.observability.sample_log): for a chosen rollout
  (or evaluation) every logged group with its prompt and samples (reward, status, advantage,
  weight version); a click on a sample shows its response tokens coloured by loss mask (trained
  vs environment/tool tokens) and shaded by the engine's log-prob, turn by turn for multi-turn
  trajectories (a byte-level token that is no whole character reads `<0xE2>`: report_tokens);
  filters by status and reward;
* the run's facts: the resolved arguments (args.json; those set for the run first, the others
  collapsed: report_args), package versions (torch, transformers, ray), the machine, and the wall
  time of each stage.

It is written at the end of every run and at each --save-interval (slime.train). What cannot be
read is said in a note at the top and the rest is rendered: a directory that is not a run
directory, a torn last metrics line, no eval points, FAILED samples. `collect` returns the data the
page shows (tested on its own); `render` turns it into the HTML.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slime.errors import SlimeError
from slime.observability.metrics import METRICS_FILE, RESERVED_KEYS, parse_metrics_lines
from slime.observability.plots import global_steps
from slime.observability.report_args import ArgDefaults, args_html
from slime.observability.report_assets import PAGE_CSS, PAGE_JS
from slime.observability.report_samples import read_json as _read_json
from slime.observability.report_samples import sample_logs as _sample_logs
from slime.observability.report_summary import render_summary, stage_summaries, stage_wall
from slime.observability.report_ticks import axis, y_range
from slime.observability.sample_log import RUN_FACTS_FILE, SAMPLES_DIR, run_facts
from slime.observability.trace_timeline import TRACES_DIR

__all__ = [
    "PANELS",
    "REPORT_FILE",
    "collect",
    "main",
    "panel_keys",
    "read_metrics_lenient",
    "render",
    "write_report",
]

REPORT_FILE = "report.html"
DEFAULT_MAX_BYTES = 40_000_000  # sample logs embedded beyond this are thinned (a note says which)

# (panel id, title, exact keys, key patterns): a panel shows the keys present in metrics.jsonl
PANELS: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("reward", "Reward", ("rollout/raw_reward", "rollout/rewards"), (r"^passrate/",)),
    (
        "eval",
        "Evaluation (incl. pass@k)",
        (),
        (r"^eval/(?!.*(/response_len/|/failed$|/dropped_long_prompts$|/error_cat/))",),
    ),
    ("response_len", "Response length", ("rollout/response_len/mean", "rollout/response_len/max"), ()),
    ("truncated", "Truncation ratio", ("rollout/truncated_ratio",), ()),
    ("clipfrac", "pg_clipfrac", ("train/pg_clipfrac",), ()),
    ("kl", "ppo_kl / kl_loss", ("train/ppo_kl", "train/kl_loss"), ()),
    ("entropy", "Entropy", ("train/entropy_loss", "rollout/entropy"), ()),
    ("grad_norm", "Grad norm", ("train/grad_norm",), ()),
    (
        "logprob_diff",
        "Train / rollout log-prob difference",
        ("train/train_rollout_logprob_abs_diff", "train/weight_sync_logprob_abs_diff", "train/mis_log_ppl_abs_diff"),
        (),
    ),
    (
        "time",
        "Step time: rollout / train / weight sync / eval (s)",
        ("perf/rollout_time", "perf/train_time", "perf/update_weights_time", "perf/eval_time", "perf/step_time"),
        (),
    ),
    ("staleness", "Staleness (async)", (), (r"staleness",)),
]
# panels of async runs only: a synchronous run logs their keys as 0 throughout (on policy), drawn as nothing
ZERO_MEANS_UNUSED = ("staleness",)
STAGE_TIME_KEYS = ("perf/rollout_time", "perf/train_time", "perf/update_weights_time", "perf/eval_time")


def read_metrics_lenient(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of a metrics.jsonl and notes on what was skipped (a torn last line, a bad line),
    never an exception for the content: the report renders what is there."""
    notes: list[str] = []
    try:
        raw = path.read_bytes()
    except OSError as e:
        return [], [f"{path}: not readable ({e})"]
    text = raw.decode("utf-8", errors="replace")
    records: list[dict[str, Any]] = []
    for lineno, obj, problem, torn in parse_metrics_lines(text):
        if torn:
            notes.append(
                f"{path.name}: the last line (line {lineno}) is torn, a write cut short (crash or kill?); "
                "it is left out, the rows before it are shown"
            )
        elif problem:
            notes.append(f"{path.name}:{lineno}: {problem}; line left out")
        elif obj is not None:  # always, when there is no problem
            records.append(obj)
    return records, notes


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def panel_keys(keys: Sequence[str]) -> dict[str, list[str]]:
    """panel id -> the metric keys (of `keys`) it plots, in PANELS order."""
    out: dict[str, list[str]] = {}
    for pid, _, exact, patterns in PANELS:
        chosen = [k for k in exact if k in keys]
        for k in sorted(keys):
            if k not in chosen and any(re.search(p, k) for p in patterns):
                chosen.append(k)
        out[pid] = chosen
    return out


def _drawn(pid: str, keys: list[str], series: dict[str, list[list[Any]]]) -> bool:
    """Whether a panel is drawn: it has a key the run logged (a number somewhere), and for an
    async-only panel a value other than 0."""
    if not keys:
        return False
    return pid not in ZERO_MEANS_UNUSED or any(p[1] != 0 for k in keys for p in series[k])


def chart_axes(points: list[list[Any]]) -> dict[str, Any]:
    """The full view of a chart of `points` ([x, y, ...]): x and y range and their ticks (the page
    draws these; a zoomed view computes the same in its script)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 - 0.5, x1 + 0.5
    y0, y1 = y_range(min(ys), max(ys))
    return {"x0": x0, "x1": x1, "y0": y0, "y1": y1, "xticks": axis(x0, x1, 6, 1), "yticks": axis(y0, y1, 4)}


def _panels(series: dict[str, list[list[Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the panels drawn, each with its keys and axes; the titles of those the run logged nothing for)."""
    keys = panel_keys(list(series))
    drawn, left_out = [], []
    for pid, title, _, _ in PANELS:
        if _drawn(pid, keys[pid], series):
            pts = [p for k in keys[pid] for p in series[k]]
            drawn.append({"id": pid, "title": title, "keys": keys[pid], "axes": chart_axes(pts)})
        else:
            left_out.append(title)
    return drawn, left_out


def _series(records: list[dict[str, Any]]) -> tuple[dict[str, list[list[Any]]], list[int | None]]:
    """key -> [[x, y, rollout_id, stage], ...] over the records with a finite number for key."""
    xs = global_steps(records)
    series: dict[str, list[list[Any]]] = {}
    for r, x in zip(records, xs, strict=True):
        if x is None:
            continue
        for k, v in r.items():
            if k in RESERVED_KEYS or not _is_number(v):
                continue
            series.setdefault(k, []).append([x, float(v), r.get("rollout_id"), r.get("stage")])
    for pts in series.values():
        pts.sort(key=lambda p: p[0])
    return series, xs


def _stage_times(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stage (in order of appearance): rows, steps, wall time and start-up (from `time`: seconds
    since the stage's logger started; report_summary.stage_wall) and the sum of each perf/*_time."""
    stages: dict[str, dict[str, Any]] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        name = r.get("stage") or "(run)"
        st = stages.setdefault(
            name,
            {
                "stage": name,
                "rows": 0,
                "first_step": None,
                "last_step": None,
                "wall_s": None,
                "startup_s": None,
                **dict.fromkeys(STAGE_TIME_KEYS, 0.0),
            },
        )
        rows.setdefault(name, []).append(r)
        st["rows"] += 1
        rid = r.get("rollout_id")
        if _is_number(rid):
            st["first_step"] = rid if st["first_step"] is None else min(st["first_step"], rid)
            st["last_step"] = rid if st["last_step"] is None else max(st["last_step"], rid)
        for k in STAGE_TIME_KEYS:
            if _is_number(r.get(k)):
                st[k] += float(r[k])
    for name, st in stages.items():
        st["wall_s"], st["startup_s"], _ = stage_wall(rows[name])
    return list(stages.values())


def _read_records(run_dir: Path, metrics_path: Path, args_files: list[Path], notes: list[str]) -> list[dict[str, Any]]:
    """The metrics rows of the run (none yet is a note, as is a directory that is no run's)."""
    if not metrics_path.is_file() and not args_files:
        notes.append(
            f"{run_dir} is not a run directory: it has no {METRICS_FILE} and no args.json "
            "(a run's --run-dir has both). Showing what is there."
        )
    records: list[dict[str, Any]] = []
    if metrics_path.is_file():
        records, more = read_metrics_lenient(metrics_path)
        notes += more
        if not records:
            notes.append(f"{METRICS_FILE} has no metrics rows yet: no curves")
    elif args_files:
        notes.append(f"no {METRICS_FILE} yet (the run has not finished a step): no curves")
    return records


def _recorded_facts(run_dir: Path, notes: list[str]) -> tuple[dict[str, Any], str]:
    """(the machine and software facts of the run, where they come from): the run's own record,
    else this machine's now."""
    facts_file = run_dir / RUN_FACTS_FILE
    facts = _read_json(facts_file, notes) if facts_file.is_file() else None
    if not isinstance(facts, dict):
        return run_facts(), "this machine when the report was written (the run recorded none)"
    return facts, f"recorded by the run ({RUN_FACTS_FILE})"


def collect(
    run_dir: str | Path,
    *,
    max_rollouts: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    arg_defaults: ArgDefaults | None = None,
) -> dict[str, Any]:
    """Everything the report shows, read from a run directory (see the module doc). Raises
    SlimeError only when `run_dir` is not a directory; anything else unreadable becomes a note.
    `arg_defaults`: `slime train`'s parser defaults (report_args.defaults_of(build_parser())), to
    tell which arguments of an args.json without `options_given` were set."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise SlimeError(
            f"slime report: {run_dir} is not a directory (give a run directory: the --run-dir of a run, "
            "holding metrics.jsonl and args.json)"
        )
    notes: list[str] = []
    metrics_path = run_dir / METRICS_FILE
    args_files = sorted(run_dir.glob("args*.json"))
    records = _read_records(run_dir, metrics_path, args_files, notes)
    series, xs = _series(records)
    panels, left_out = _panels(series)
    if records and not any(p["id"] == "eval" for p in panels):
        notes.append(
            "no evaluation points in metrics.jsonl (run without --eval-prompt-data, or no eval step "
            "yet): no evaluation chart"
        )
    failed_rows = [
        r.get("rollout_id")
        for r in records
        if _is_number(r.get("rollout/status/failed")) and r["rollout/status/failed"] > 0
    ]
    if failed_rows:
        notes.append(
            f"FAILED samples (never trained on) in the rollouts of steps {_ids(failed_rows)}: see "
            "rollout/status/failed and the browser's status filter"
        )

    args_json = {}
    for f in args_files:
        obj = _read_json(f, notes)
        if isinstance(obj, dict):
            args_json[f.name] = obj
    facts, facts_source = _recorded_facts(run_dir, notes)

    rollouts = _sample_logs(run_dir, notes, max_rollouts, max_bytes, args_json)
    if (run_dir / SAMPLES_DIR).is_dir() and not rollouts:
        notes.append(f"{SAMPLES_DIR}/ holds no readable sample log")
    elif not (run_dir / SAMPLES_DIR).is_dir() and (metrics_path.is_file() or args_files):
        notes.append(
            f"no sample log ({SAMPLES_DIR}/): the rollout browser is empty (the run predates it, or "
            "ran with --report-groups-per-rollout 0)"
        )
    failed_logged = sum(r["num_failed_logged"] for r in rollouts)
    if failed_logged:
        notes.append(
            f"{failed_logged} logged samples are FAILED (kept, counted, never trained on): shown with "
            "their error in the rollout browser"
        )

    return {
        "run_dir": str(run_dir.resolve()),
        "notes": notes,
        "num_records": len(records),
        "series": series,
        "panels": panels,
        "panels_left_out": left_out,
        "key_axes": {k: chart_axes(pts) for k, pts in series.items()},
        "all_keys": sorted(series),
        "summary": stage_summaries(records, xs),
        "stages": _stage_times(records),
        "args": args_json,
        "args_html": args_html(args_json, arg_defaults),
        "facts": facts,
        "facts_source": facts_source,
        "rollouts": rollouts,
        "files": sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir())[:200],
        "traces": sorted(p.relative_to(run_dir).as_posix() for p in run_dir.glob(f"{TRACES_DIR}/*.trace.json")),
    }


def _ids(ids: list[Any]) -> str:
    shown = ", ".join(str(i) for i in ids[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _json_for_script(obj: Any) -> str:
    """JSON that is safe inside <script>: `<`, `>`, `&` only as \\u escapes (they occur in strings
    only), so no `</script>` or `<!--` in the data can end the block; still valid JSON."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _sanitize(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_sanitize(v) for v in obj]
    return obj


# rendered as HTML by Python, so left out of the page's JSON
_STATIC_KEYS = ("args", "args_html", "summary", "files")


def _left_out_hint(titles: list[str]) -> str:
    if not titles:
        return ""
    return (
        '<div class="hint" id="panels-left-out">Not logged by this run, so not drawn: '
        f"{html.escape(', '.join(titles))}.</div>"
    )


def _files_html(files: list[str]) -> str:
    return f'<h3>Files in the run directory</h3><div class="hint">{html.escape("  ".join(files))}</div>'


def _traces_html(traces: list[str]) -> str:
    """Links to the per-sample timelines (slime.observability.trace_utils), if the run wrote any."""
    if not traces:
        return ""
    links = " ".join(f'<a href="{html.escape(t)}">{html.escape(t)}</a>' for t in traces)
    return (
        '<h3>Sample timelines</h3><div class="hint">Chrome trace-event JSON, one row per sample: open in '
        f"https://ui.perfetto.dev or chrome://tracing. {links}</div>"
    )


def render(data: dict[str, Any]) -> str:
    """The HTML page of `collect`'s data: one file, inline CSS/JS, no network."""
    title = f"slime run report: {Path(data['run_dir']).name}"
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in data["notes"])
    page_data = {k: v for k, v in data.items() if k not in _STATIC_KEYS}
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title>"
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<style>{PAGE_CSS}</style></head><body>"
        f'<header><h1>{html.escape(title)}</h1><div class="sub">{html.escape(data["run_dir"])} · '
        f"{data['num_records']} metrics rows · {len(data['rollouts'])} sample logs</div>"
        '<nav><a href="#summary">Summary</a> <a href="#curves">Curves</a> <a href="#browser">Rollout browser</a> '
        '<a href="#facts">Run facts</a></nav></header>'
        + render_summary(data["summary"])
        + (f'<section id="notes" class="notes"><h2>Notes</h2><ul>{notes}</ul></section>' if notes else "")
        + '<section id="curves"><h2>Curves</h2><div class="hint">x: step (a metrics row\'s rollout id; '
        "the global step across stages). Drag across a chart to zoom all charts, double-click or "
        '<button id="reset-zoom" type="button">reset zoom</button>; hover for values.</div>'
        + _left_out_hint(data["panels_left_out"])
        + '<div id="charts" class="charts"></div>'
        '<div class="any"><label>Any metric: <select id="any-metric"></select></label>'
        '<div id="any-chart" class="charts"></div></div></section>'
        '<section id="browser"><h2>Rollout browser</h2><div class="controls">'
        '<label>Rollout: <select id="rollout-select"></select></label> '
        '<span id="status-filters"></span> '
        '<label>reward ≥ <input id="reward-min" type="number" step="any" size="6"></label> '
        '<label>reward ≤ <input id="reward-max" type="number" step="any" size="6"></label> '
        '<span class="legend"><span class="tok m1">trained token</span> '
        '<span class="tok m0">environment / tool token</span> darker = lower log-prob</span></div>'
        '<div id="rollout-note" class="rollout-note"></div>'
        '<div class="browser"><div id="groups" class="groups"></div>'
        '<div id="sample-detail" class="detail"><em>Click a sample to see its tokens.</em></div></div></section>'
        '<section id="facts"><h2>Run facts</h2><div id="facts-body"></div>'
        f'<h3>Resolved arguments</h3><div id="args-body">{data["args_html"]}</div>'
        f"{_files_html(data['files'])}{_traces_html(data.get('traces', []))}</section>"
        '<div id="tooltip" class="tooltip"></div>'
        f'<script id="report-data" type="application/json">{_json_for_script(_sanitize(page_data))}</script>'
        f"<script>{PAGE_JS}</script></body></html>\n"
    )


def write_report(
    run_dir: str | Path,
    output: str | Path | None = None,
    *,
    max_rollouts: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    arg_defaults: ArgDefaults | None = None,
) -> tuple[Path, list[str]]:
    """Write the report (default `<run_dir>/report.html`, via a temporary file and a rename);
    returns its path and the notes it shows."""
    data = collect(run_dir, max_rollouts=max_rollouts, max_bytes=max_bytes, arg_defaults=arg_defaults)
    out = Path(output) if output is not None else Path(run_dir) / REPORT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render(data), encoding="utf-8")
    tmp.replace(out)
    return out, data["notes"]


def report_run(run_dir: str | Path, arg_defaults: ArgDefaults | None = None) -> Path | None:
    """The training loop's call (end of a run, each save): write the report, say where; a failure
    to write it is a warning, never the end of a run."""
    try:
        out, _ = write_report(run_dir, arg_defaults=arg_defaults)
    except Exception as e:  # noqa: BLE001 - printed; a report never ends a run
        print(f"[slime] report not written ({type(e).__name__}: {e})", flush=True)
        return None
    print(f"[slime] report:  {out.resolve()}", flush=True)
    return out


def main(argv: Sequence[str] | None = None, arg_defaults: ArgDefaults | None = None) -> int:
    """`slime report` (`arg_defaults`: see `collect`; a caller above slime.arguments can pass them)."""
    p = argparse.ArgumentParser(
        prog="slime report",
        description="Write a self-contained HTML report of a run directory "
        "(curves, rollout browser, run facts); opens from disk.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's --run-dir (metrics.jsonl, args.json, samples/)")
    p.add_argument("--output", "-o", default=None, help="where to write the HTML (default: RUN_DIR/report.html)")
    p.add_argument(
        "--max-rollouts",
        type=int,
        default=None,
        help="embed at most this many sample logs (evenly spaced, the last included; default: all "
        f"that fit in {DEFAULT_MAX_BYTES // 1_000_000} MB)",
    )
    a = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.max_rollouts is not None and a.max_rollouts < 1:
        print(f"slime report: error: --max-rollouts must be >= 1, got {a.max_rollouts}", file=sys.stderr)
        return 2
    try:
        out, notes = write_report(a.run_dir, a.output, max_rollouts=a.max_rollouts, arg_defaults=arg_defaults)
    except SlimeError as e:
        print(f"slime: error: {e}", file=sys.stderr)
        return 2
    for n in notes:
        print(f"slime report: note: {n}", file=sys.stderr)
    print(f"slime report: wrote {out.resolve()}")
    return 0
