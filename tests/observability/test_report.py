"""`slime report`'s data: the sample log (slime.observability.sample_log) and what the report reads
from a run directory (slime.observability.report.collect), each checked against values computed here.
The page itself is opened in a real browser by tests/e2e/test_report_browser.py."""

from __future__ import annotations

import json
import math
import statistics
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from slime.arguments import parse_args
from slime.cli import main as cli_main
from slime.errors import SlimeError
from slime.observability import report, sample_log
from slime.observability.metrics import MetricsLogger
from slime.utils.types import Sample


def _args(run_dir: Path, groups: int = 2, stage: str | None = None) -> Namespace:
    return Namespace(
        run_dir=str(run_dir), stage=stage, report_groups_per_rollout=groups, hf_checkpoint=None, reward_key=None
    )


def _sample(index: int, group: int, reward, status=Sample.Status.COMPLETED, multi_turn: bool = False) -> Sample:
    s = Sample(index=index, group_index=group, prompt=f"what is {group}+1?", tokens=[1, 2, 3], label=str(group + 1))
    s.append_response_tokens(tokens=[10 + index, 11], log_probs=[-0.5, -1.5], trainable=True)
    s.weight_versions = ["3"]
    if multi_turn:
        s.append_response_tokens(tokens=[7, 7, 7], trainable=False)  # a tool's output
        s.append_response_tokens(tokens=[12], log_probs=[-0.25], trainable=True)
        s.metadata["turns"] = [
            {"role": "model", "start": 0, "end": 2},
            {"role": "env", "start": 2, "end": 5},
            {"role": "model", "start": 5, "end": 6},
        ]
    s.response = "x" * s.response_length
    s.reward = reward
    s.status = status
    if status == Sample.Status.FAILED:
        s.metadata["error"] = "reward: ValueError: boom"
    return s


def _groups() -> list[list[Sample]]:
    return [[_sample(4 * g + j, g, float(j), multi_turn=(g == 1)) for j in range(4)] for g in range(3)]


# ---- the sample log -------------------------------------------------------------------------------


def test_sample_record_holds_tokens_mask_logprobs_and_turns():
    s = _sample(5, 1, {"score": 0.5, "acc": True}, multi_turn=True)
    rec = sample_log.sample_record(Namespace(reward_key=None), s, train_index=9)
    assert rec["response_ids"] == [15, 11, 7, 7, 7, 12]  # the response = the last response_length tokens
    assert rec["prompt_length"] == 3 and rec["response_length"] == 6
    assert rec["loss_mask"] == [1, 1, 0, 0, 0, 1]
    assert rec["log_probs"] == [-0.5, -1.5, 0.0, 0.0, 0.0, -0.25]
    assert rec["reward"] == 0.5 and rec["reward_raw"] == {"score": 0.5, "acc": True}  # dict: its "score"
    assert rec["turns"][1] == {"role": "env", "start": 2, "end": 5}
    assert rec["train_index"] == 9 and rec["status"] == "completed" and rec["weight_versions"] == ["3"]
    assert rec["response_tokens"] is None  # no tokenizer: the ids still tell
    failed = sample_log.sample_record(
        Namespace(reward_key=None), _sample(0, 0, None, Sample.Status.FAILED), train_index=0
    )
    assert failed["status"] == "failed" and failed["reward"] is None and "boom" in failed["error"]
    json.dumps(rec, allow_nan=False)


def test_rollout_log_keeps_the_first_groups_with_their_train_index(tmp_path):
    groups = _groups()
    groups[2][1].status = Sample.Status.FAILED
    path = sample_log.write_rollout_samples(_args(tmp_path, groups=2), groups, rollout_id=7)
    assert path == tmp_path / "samples" / "rollout_000007.json"
    log = json.loads(path.read_text())
    assert (log["num_groups"], log["num_samples"], len(log["groups"])) == (3, 12, 2)
    # train index = the sample's position in the flattened rollout (the trainer's index)
    assert [s["train_index"] for g in log["groups"] for s in g["samples"]] == list(range(8))
    assert [s["index"] for g in log["groups"] for s in g["samples"]] == list(range(8))
    assert not list(path.parent.glob(".*.tmp"))  # written atomically
    facts = json.loads((tmp_path / sample_log.RUN_FACTS_FILE).read_text())
    assert facts["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]  # what the run had
    assert sample_log.write_rollout_samples(_args(tmp_path, groups=0), groups, rollout_id=8) is None
    assert not (tmp_path / "samples" / "rollout_000008.json").exists()
    staged = sample_log.write_rollout_samples(_args(tmp_path, stage="rl"), groups, rollout_id=0)
    assert staged == tmp_path / "samples" / "rl" / "rollout_000000.json"
    # no run directory (a manager driven without slime.train): nothing is written, nothing created
    assert sample_log.write_rollout_samples(_args(tmp_path / "none"), groups, rollout_id=0) is None
    assert not (tmp_path / "none").exists()


def test_failed_samples_are_logged(tmp_path):
    groups = _groups()
    groups[0][2] = _sample(2, 0, None, Sample.Status.FAILED)
    log = json.loads(sample_log.write_rollout_samples(_args(tmp_path), groups, 0).read_text())
    s = log["groups"][0]["samples"][2]
    assert s["status"] == "failed" and s["error"] == "reward: ValueError: boom"


def test_eval_log_has_the_first_groups_of_each_data_set(tmp_path):
    results = {
        "arith": {"samples": [_sample(i, i // 2, 1.0) for i in range(6)]},
        "other": {"samples": [_sample(i, i, 0.0) for i in range(3)]},
    }
    path = sample_log.write_eval_samples(_args(tmp_path, groups=2), results, rollout_id=-1)
    log = json.loads(path.read_text())
    assert log["evaluation"] and path.name == "eval_-00001.json"  # the eval before training
    assert [r["rollout_id"] for r in report.collect(tmp_path)["rollouts"]] == [-1]
    assert [(g["dataset"], len(g["samples"])) for g in log["groups"]] == [
        ("arith", 2),
        ("arith", 2),
        ("other", 1),
        ("other", 1),
    ]
    assert (log["num_groups"], log["num_samples"]) == (6, 9)


def test_advantages_are_written_for_logged_samples_of_this_rank_only(tmp_path):
    args = _args(tmp_path, groups=1)
    sample_log.write_rollout_samples(args, _groups(), rollout_id=2)  # logs train indices 0..3
    adv = {i: torch.full((3,), float(i)) for i in range(12)}
    path = sample_log.write_advantages(args, 2, {"advantages": adv}, mine=[0, 2, 5, 7], rank=1)
    assert path.name == "rollout_000002.adv.rank1.json"
    assert json.loads(path.read_text())["advantages"] == {"0": [0.0] * 3, "2": [2.0] * 3}
    # nothing logged for the rollout, or nothing of it on this rank: no file
    assert sample_log.write_advantages(args, 3, {"advantages": adv}, mine=[0], rank=0) is None
    assert sample_log.write_advantages(args, 2, {"advantages": adv}, mine=[9], rank=0) is None


def test_option_is_parsed_and_checked():
    base = ["--rollout-batch-size", "1", "--num-rollout", "1"]
    assert parse_args(base).report_groups_per_rollout == 4
    assert parse_args(base + ["--report-groups-per-rollout", "0"]).report_groups_per_rollout == 0
    with pytest.raises(SlimeError, match="--report-groups-per-rollout must be >= 0"):
        parse_args(base + ["--report-groups-per-rollout", "-1"])


# ---- what the report reads ----------------------------------------------------------------------


def _run_dir(tmp_path: Path, with_eval: bool = True) -> Path:
    run = tmp_path / "run"
    with MetricsLogger(run, stage="sft", console=False) as log:
        log.log(1, {"train/sft_loss": 2.0, "perf/train_time": 1.0})
    with MetricsLogger(run, stage="rl", console=False) as log:  # continues the global step
        if with_eval:
            log.log(0, {"eval/arith": 0.25, "eval/arith/pass@4": 0.5, "eval/arith/response_len/mean": 7.0})
        for k in (1, 2, 3):
            row = {
                "rollout/raw_reward": 0.1 * k,
                "train/grad_norm": float(k),
                "perf/rollout_time": 2.0,
                "perf/train_time": 3.0,
                "perf/update_weights_time": 0.5,
                "rollout/fully_async/staleness_mean": 0.5,
                "rollout/status/failed": float(k == 2),
            }
            if with_eval and k == 3:
                row["eval/arith"] = 0.75
            log.log(k, row)
    (run / "args.json").write_text(json.dumps({"lr": 1e-3, "stage": "rl"}))
    return run


def test_metrics_lenient_reader_notes_a_torn_last_line_and_bad_lines(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"rollout_id": 1, "a": 1}\nnot json\n[1]\n{"rollout_id": 2, "a": 2}\n{"rollout_id": 3, "a"')
    records, notes = report.read_metrics_lenient(p)
    assert [r["rollout_id"] for r in records] == [1, 2]
    assert any("line 5" in n and "torn" in n for n in notes)
    assert any("metrics.jsonl:2: not valid JSON" in n for n in notes)
    assert any("metrics.jsonl:3" in n and "expected a JSON object" in n for n in notes)


def test_panels_pick_the_issue_metrics():
    keys = [
        "rollout/raw_reward",
        "eval/arith",
        "eval/arith/pass@4",
        "eval/math-pass@2",
        "eval/arith/response_len/mean",
        "eval/arith/failed",
        "rollout/response_len/mean",
        "rollout/truncated_ratio",
        "train/pg_clipfrac",
        "train/ppo_kl",
        "train/entropy_loss",
        "train/grad_norm",
        "train/train_rollout_logprob_abs_diff",
        "perf/rollout_time",
        "perf/train_time",
        "perf/update_weights_time",
        "rollout/fully_async/staleness_max",
        "passrate/pass@4",
    ]
    p = report.panel_keys(keys)
    assert p["reward"] == ["rollout/raw_reward", "passrate/pass@4"]
    assert p["eval"] == ["eval/arith", "eval/arith/pass@4", "eval/math-pass@2"]
    assert p["time"] == ["perf/rollout_time", "perf/train_time", "perf/update_weights_time"]
    assert p["staleness"] == ["rollout/fully_async/staleness_max"]
    for pid in ("response_len", "truncated", "clipfrac", "kl", "entropy", "grad_norm", "logprob_diff"):
        assert p[pid], pid


def test_collect_series_stage_times_and_notes(tmp_path):
    run = _run_dir(tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    data = report.collect(run)
    # x = the global step the metrics logger wrote, per point, with the rollout id and stage
    expect = [
        [r["global_step"], r["rollout/raw_reward"], r["rollout_id"], r["stage"]]
        for r in rows
        if "rollout/raw_reward" in r
    ]
    assert data["series"]["rollout/raw_reward"] == expect
    assert [p[0] for p in data["series"]["eval/arith"]] == [rows[1]["global_step"], rows[-1]["global_step"]]
    panels = {p["id"]: p["keys"] for p in data["panels"]}
    assert panels["eval"] == ["eval/arith", "eval/arith/pass@4"] and panels["staleness"]
    stages = {s["stage"]: s for s in data["stages"]}
    assert stages["rl"]["perf/train_time"] == pytest.approx(9.0) and stages["sft"]["perf/train_time"] == 1.0
    assert stages["rl"]["rows"] == 4 and stages["rl"]["wall_s"] == max(r["time"] for r in rows if r["stage"] == "rl")
    assert data["args"]["args.json"]["lr"] == 1e-3
    assert any("FAILED" in n and "2" in n for n in data["notes"])
    assert any("no sample log" in n for n in data["notes"])
    assert not any("no evaluation points" in n for n in data["notes"])
    assert data["facts"]["versions"]["torch"] and "this machine" in data["facts_source"]


def test_collect_notes_no_eval_torn_line_and_not_a_run_dir(tmp_path):
    run = _run_dir(tmp_path, with_eval=False)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"rollout_id": 4, "rollout/raw_')  # a crash mid-write
    data = report.collect(run)
    assert any("no evaluation points" in n for n in data["notes"])
    assert any("torn" in n for n in data["notes"])
    assert len(data["series"]["rollout/raw_reward"]) == 3
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hi")
    d = report.collect(other)
    assert any("is not a run directory" in n for n in d["notes"]) and d["files"] == ["notes.txt"]
    with pytest.raises(SlimeError, match="is not a directory"):
        report.collect(tmp_path / "missing")


def test_collect_merges_advantages_and_thins_many_logs(tmp_path):
    run = _run_dir(tmp_path)
    args = _args(run, groups=1)
    for rid in range(10):
        sample_log.write_rollout_samples(args, _groups(), rid)
    sample_log.write_advantages(args, 9, {"advantages": {i: torch.full((2,), 0.5) for i in range(4)}}, [0, 1], 0)
    sample_log.write_advantages(args, 9, {"advantages": {i: torch.full((2,), -0.5) for i in range(4)}}, [2, 3], 1)
    data = report.collect(run, max_rollouts=4)
    assert [r["rollout_id"] for r in data["rollouts"]] == [0, 3, 6, 9]  # evenly spaced, first and last kept
    assert any("10 sample logs" in n for n in data["notes"])
    last = data["rollouts"][-1]
    assert last["has_advantages"] and [s.get("advantages") for s in last["groups"][0]["samples"]] == [
        [0.5, 0.5],
        [0.5, 0.5],
        [-0.5, -0.5],
        [-0.5, -0.5],
    ]
    assert not data["rollouts"][0]["has_advantages"]
    small = report.collect(run, max_bytes=1)  # over the size budget: only the last is embedded
    assert [r["rollout_id"] for r in small["rollouts"]] == [9]


def test_render_is_self_contained_and_escapes_data(tmp_path):
    run = _run_dir(tmp_path)
    groups = _groups()
    groups[0][0].prompt = "</script><script>alert(1)</script> <!-- x"
    sample_log.write_rollout_samples(_args(run), groups, 0)
    page = report.render(report.collect(run))
    assert page.count("</script>") == 2  # the data block's and the code's: the prompt cannot close either
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert " src=" not in page and "<link" not in page  # nothing loaded from anywhere
    start = page.index('id="report-data" type="application/json">') + len('id="report-data" type="application/json">')
    data = json.loads(page[start : page.index("</script>", start)])
    assert data["rollouts"][0]["groups"][0]["samples"][0]["prompt"].startswith("</script>")


def test_cli_writes_the_report_and_says_what_it_noted(tmp_path, capsys):
    run = _run_dir(tmp_path, with_eval=False)
    assert cli_main(["report", str(run)]) == 0
    out = capsys.readouterr()
    assert (run / "report.html").stat().st_size > 10_000 and "wrote" in out.out
    assert "note: no evaluation points" in out.err
    assert cli_main(["report", str(run), "-o", str(tmp_path / "x" / "r.html"), "--max-rollouts", "2"]) == 0
    assert (tmp_path / "x" / "r.html").exists()
    assert cli_main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert cli_main(["report", str(run), "--max-rollouts", "0"]) == 2
    assert report.report_run(tmp_path / "missing") is None  # the training loop's call never raises


def test_eval_series_match_an_independent_read(tmp_path):
    run = _run_dir(tmp_path)
    data = report.collect(run)
    direct = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for key, pts in data["series"].items():
        vals = [r[key] for r in direct if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        assert [p[1] for p in pts] == pytest.approx(vals), key
    assert statistics.mean(p[1] for p in data["series"]["rollout/raw_reward"]) == pytest.approx(0.2)


def test_only_charts_of_metrics_the_run_logged_are_drawn(tmp_path):
    run = tmp_path / "run"
    with MetricsLogger(run, console=False) as log:
        for k in (1, 2):  # a synchronous run: staleness 0 throughout; a metric that is never finite
            log.log(k, {"rollout/raw_reward": 0.5, "rollout/staleness/mean": 0.0, "train/grad_norm": float("nan")})
    data = report.collect(run)
    assert [p["id"] for p in data["panels"]] == ["reward"]
    assert "Staleness (async)" in data["panels_left_out"] and "Grad norm" in data["panels_left_out"]
    assert data["panels"][0]["axes"]["yticks"] and "rollout/staleness/mean" in data["key_axes"]  # still in the menu
    page = report.render(data)
    assert 'id="panels-left-out"' in page and "no such metric" not in page
    with MetricsLogger(run, console=False) as log:  # an async run: drawn
        log.log(3, {"rollout/staleness/mean": 1.0})
    assert "staleness" in [p["id"] for p in report.collect(run)["panels"]]
