"""The summary at the top of `slime report`'s page (slime.observability.report_summary), from
metrics rows written here: eval scores, reward trend, wall-time split and rollouts, per stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.observability import report
from slime.observability.report_summary import fmt_seconds, render_summary, stage_summaries


def _row(stage: str | None, rid: int, t: float, **metrics: float) -> dict:
    row = {"rollout_id": rid, "global_step": rid, "time": t, **{k.replace("__", "/"): v for k, v in metrics.items()}}
    return row | ({"stage": stage} if stage else {})


def _rl_rows(stage: str | None = "rl") -> list[dict]:
    """An eval before training at t=40 (start-up 40 - 4 s), then 6 steps of 10 s, evals at 3 and 6."""
    rows = [_row(stage, 0, 40.0, **{"eval__math": 0.2, "eval__math__pass@1": 0.25, "perf__eval_time": 4.0})]
    for k in range(1, 7):
        m = {
            "rollout__raw_reward": 0.1 * k,
            "perf__rollout_wait_time": 3.0,
            "perf__rollout_time": 2.5,
            "perf__train_wait_time": 5.0,
            "perf__train_time": 4.5,
            "perf__sync_wait_time": 1.0,
            "perf__update_weights_time": 0.8,
            "perf__step_time": 10.0,
        }
        if k in (3, 6):
            m |= {"eval__math": 0.6 if k == 3 else 0.5, "eval__math-pass@2": 0.7, "perf__eval_time": 0.5}
        rows.append(_row(stage, k, 40.0 + 10.0 * k, **m))
    return rows


def test_one_stage_scores_trend_time_and_rollouts():
    rows = _rl_rows(stage=None)
    (s,) = stage_summaries(rows, [r["global_step"] for r in rows])
    assert s["stage"] is None and s["rollouts"] == 6 and s["starts"] == 1
    (ev,) = s["evals"]  # eval/math-pass@2 (--log-passrate) is no data set of its own
    assert ev["key"] == "eval/math"  # the mean reward, not pass@1
    assert (ev["first"], ev["final"], ev["final_step"], ev["best"], ev["best_step"]) == (0.2, 0.5, 6, 0.6, 3)
    assert s["trend"]["key"] == "rollout/raw_reward"
    assert s["trend"]["first"] == pytest.approx(0.1) and s["trend"]["last"] == pytest.approx(0.6)
    assert s["trend"]["last_n"] == 5 and s["trend"]["last_mean"] == pytest.approx(0.4)  # mean of 0.2 .. 0.6
    assert s["wall_s"] == 100.0 and s["startup_s"] == 36.0  # the first row's time less its own eval
    phases = {p["phase"]: (p["key"], p["seconds"]) for p in s["phases"]}
    assert phases == {
        "rollout": ("perf/rollout_wait_time", 18.0),  # the loop's wait, which adds up to the step
        "train": ("perf/train_wait_time", 30.0),
        "weight sync": ("perf/sync_wait_time", 6.0),
        "eval": ("perf/eval_time", 5.0),
    }
    assert s["other_s"] == pytest.approx(100.0 - 36.0 - 18.0 - 30.0 - 6.0 - 5.0)


def test_phase_keys_fall_back_to_the_phase_timers_and_eval_to_a_custom_score():
    rows = [
        _row(None, 1, 12.0, perf__rollout_time=2.0, perf__train_time=3.0, **{"eval__code__score": 0.4}),
        _row(None, 2, 17.0, perf__rollout_time=2.0, perf__train_time=3.0),
    ]
    (s,) = stage_summaries(rows, [1, 2])
    phases = {p["phase"]: (p["key"], p["seconds"]) for p in s["phases"]}
    assert phases["rollout"] == ("perf/rollout_time", 4.0) and phases["train"] == ("perf/train_time", 6.0)
    assert phases["weight sync"] == (None, None) and phases["eval"] == (None, None)
    assert s["startup_s"] == 7.0  # 12 s less the row's own 2 + 3 s
    assert s["evals"][0]["key"] == "eval/code/score"
    assert s["trend"] is None  # no reward, no loss: the summary says so


def test_stages_are_summarised_apart_and_a_resumed_stage_adds_its_starts():
    sft = [_row("sft", k, 5.0 + 2.0 * k, train__sft_loss=2.0 / k, perf__train_time=2.0) for k in (1, 2, 3)]
    rl = _rl_rows()
    resumed = [_row("rl", 7, 25.0, rollout__raw_reward=0.9, perf__step_time=10.0)]  # a new logger: time from 0
    rows = sft + rl + resumed
    xs = [r["global_step"] for r in sft] + [r["global_step"] + 4 for r in rl + resumed]
    sft_s, rl_s = stage_summaries(rows, xs)
    assert (sft_s["stage"], rl_s["stage"]) == ("sft", "rl")
    assert sft_s["trend"]["key"] == "train/sft_loss" and sft_s["evals"] == [] and sft_s["rollouts"] == 3
    assert sft_s["wall_s"] == 11.0 and sft_s["startup_s"] == 5.0
    assert rl_s["rollouts"] == 7 and rl_s["starts"] == 2
    assert rl_s["wall_s"] == 100.0 + 25.0 and rl_s["startup_s"] == 36.0 + 15.0
    assert rl_s["trend"]["last"] == 0.9


def test_summary_html_says_which_keys_it_shows():
    rows = _rl_rows()
    page = render_summary(stage_summaries(rows, [r["global_step"] for r in rows]))
    assert page.startswith("<section id='summary'>") and "Stage rl · 6 rollouts · wall 1 min 40 s" in page
    assert "<code>eval/math</code> (mean reward)" in page
    assert "0.5 <span class='at'>(step 6)</span>" in page and "0.6 <span class='at'>(step 3)</span>" in page
    assert "<code>rollout/raw_reward</code>: 0.1 → <b>0.6</b> ▲" in page
    assert "mean of the last 5: <b>0.4</b>" in page
    for part in ("start-up 36.0 s", "rollout 18.0 s", "train 30.0 s", "weight sync 6.0 s", "eval 5.0 s"):
        assert part in page, part
    assert "sum of perf/rollout_wait_time" in page
    assert "no metrics rows yet" in render_summary([])
    assert fmt_seconds(59.94) == "59.9 s" and fmt_seconds(3725) == "1 h 02 min"


def test_report_page_opens_with_the_summary(tmp_path: Path):
    rows = _rl_rows()
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = report.collect(tmp_path)
    assert [s["stage"] for s in data["summary"]] == ["rl"]
    page = report.render(data)
    assert page.index("id='summary'") < page.index('id="curves"')
    assert '<a href="#summary">Summary</a>' in page
    embedded = page[page.index('id="report-data"') :]
    assert '"summary"' not in embedded and '"args"' not in embedded  # rendered as HTML, not shipped twice
