"""MetricsLogger (JSONL + TensorBoard + console), Timer, and plot_run."""

import json
import math
import time

import pytest
import torch

from slime.observability.metrics import MetricsLogger, read_metrics
from slime.observability.plots import global_steps, plot_run
from slime.observability.timer import Timer, timer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_two_stages_share_jsonl_and_tensorboard(tmp_path, capsys):
    run = tmp_path / "run"
    with MetricsLogger(run, use_tensorboard=True, stage="sft") as lg:
        for step in range(3):
            lg.log(step, {"train/sft_loss": 1.0 / (step + 1), "perf/train_time": torch.tensor(0.5)})
        lg.log(2, {"eval/gsm8k": 0.25})
    out = capsys.readouterr().out
    assert "[sft] step 0 | " in out and "train/sft_loss=1 " in out and "train/sft_loss=0.3333" in out

    with MetricsLogger(run, use_tensorboard=True, stage="rl") as lg:
        assert lg.step_offset == 3
        lg.log(0, {"rollout/raw_reward": 0.123456, "train/pg_loss": float("nan"), "eval/gsm8k": 0.5})
        lg.log(1, {"rollout/raw_reward": 0.5, "train/pg_loss": -0.01, "note": "hello", "flag": True})
    out = capsys.readouterr().out
    assert "rollout/raw_reward=0.1235" in out
    assert "NON-FINITE: train/pg_loss=nan" in out
    assert "(global 3)" in out

    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 6
    recs = [json.loads(line) for line in lines]  # each line is strict JSON (no NaN tokens)
    assert "NaN" not in (run / "metrics.jsonl").read_text()
    assert [r["rollout_id"] for r in recs] == [0, 1, 2, 2, 0, 1]
    assert [r["global_step"] for r in recs] == [0, 1, 2, 2, 3, 4]
    assert [r["stage"] for r in recs] == ["sft"] * 4 + ["rl"] * 2
    assert recs[4]["train/pg_loss"] is None
    assert recs[0]["perf/train_time"] == 0.5
    assert recs[5]["note"] == "hello" and recs[5]["flag"] == 1
    assert all(isinstance(r["time"], float) and r["time"] >= 0 for r in recs)
    assert read_metrics(run) == recs == read_metrics(run / "metrics.jsonl")

    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 2 and all(e.stat().st_size > 0 for e in events)


def test_tensorboard_scalars_use_global_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, use_tensorboard=True, stage="a", console=False) as lg:
        lg.log(0, {"rollout/raw_reward": 0.1})
        lg.log(1, {"rollout/raw_reward": 0.2})
    with MetricsLogger(tmp_path, use_tensorboard=True, stage="b", console=False) as lg:
        lg.log(0, {"rollout/raw_reward": 0.3, "train/pg_loss": float("inf")})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("rollout/raw_reward")
    assert sorted(e.step for e in events) == [0, 1, 2]
    assert [round(e.value, 6) for e in sorted(events, key=lambda e: e.step)] == [0.1, 0.2, 0.3]
    assert "train/pg_loss" not in acc.Tags()["scalars"]  # non-finite skipped in TensorBoard


def test_resumed_stage_keeps_its_offset_and_explicit_offset(tmp_path):
    with MetricsLogger(tmp_path, stage="sft", console=False) as lg:
        lg.log(0, {"x": 1})
        lg.log(1, {"x": 1})
    with MetricsLogger(tmp_path, stage="rl", console=False) as lg:
        lg.log(0, {"x": 1})
        lg.log(1, {"x": 1})
    with MetricsLogger(tmp_path, stage="rl", console=False) as lg:  # resume of the same stage
        assert lg.step_offset == 2
        lg.log(2, {"x": 1})
    with MetricsLogger(tmp_path, stage="other", step_offset=100, console=False) as lg:
        lg.log(1, {"x": 1})
    assert [r["global_step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4, 101]


def test_logger_validation_and_truncated_last_line(tmp_path):
    lg = MetricsLogger(tmp_path, console=False)
    with pytest.raises(ValueError, match="reserved"):
        lg.log(0, {"time": 1.0})
    with pytest.raises(ValueError, match="scalar"):
        lg.log(0, {"x": torch.zeros(3)})
    lg.log(0, {"rollout_id": 0, "x": 2})
    lg.close()
    lg.close()
    with pytest.raises(ValueError, match="closed"):
        lg.log(1, {"x": 1})
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"rollout_id": 1, "x"')  # crash mid-write
    assert len(read_metrics(path)) == 1
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        read_metrics(path)


def test_timer_records_perf_key():
    store = {}
    with timer("rollout", store) as t:
        time.sleep(0.01)
    assert store["perf/rollout_time"] == t.elapsed >= 0.01
    with pytest.raises(RuntimeError):
        with Timer("train", store):
            raise RuntimeError("boom")
    assert store["perf/train_time"] >= 0
    with timer("update_weights", store, accumulate=True):
        pass
    first = store["perf/update_weights_time"]
    with timer("update_weights", store, accumulate=True):
        time.sleep(0.005)
    assert store["perf/update_weights_time"] >= first + 0.005


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_plot_two_stages_png(tmp_path):
    recs = []
    for i in range(4):
        recs.append({"rollout_id": i, "global_step": i, "stage": "sft", "train/sft_loss": 1.0})
    recs.append({"rollout_id": 3, "global_step": 3, "stage": "sft", "eval/gsm8k": 0.1})
    for i in range(5):
        recs.append({"rollout_id": i, "global_step": 4 + i, "stage": "rl", "rollout/raw_reward": 0.1 * i})
        if i % 2 == 0:
            recs.append(
                {"rollout_id": i, "global_step": 4 + i, "stage": "rl", "eval/gsm8k": 0.2 + 0.1 * i, "eval/math": None}
            )
    _write(tmp_path / "metrics.jsonl", recs)
    out = plot_run(tmp_path, tmp_path / "plots" / "run.png")
    assert out == tmp_path / "plots" / "run.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000


def test_plot_with_missing_series_and_empty_file(tmp_path):
    _write(tmp_path / "metrics.jsonl", [{"rollout_id": 0, "train/pg_loss": 0.1}])
    assert plot_run(tmp_path / "metrics.jsonl", tmp_path / "a.png").read_bytes()[:8] == PNG_MAGIC
    (tmp_path / "metrics.jsonl").write_text("")
    assert plot_run(tmp_path, tmp_path / "b.png").read_bytes()[:8] == PNG_MAGIC


def test_plot_from_real_logger_output(tmp_path):
    with MetricsLogger(tmp_path, stage="sft", console=False) as lg:
        lg.log(0, {"eval/acc": 0.1})
    with MetricsLogger(tmp_path, stage="rl", console=False) as lg:
        for i in range(3):
            lg.log(i, {"rollout/raw_reward": i * 0.2, "eval/acc": math.nan})
    assert plot_run(tmp_path, tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC


def test_global_steps_derived_without_field():
    recs = [
        {"rollout_id": 0, "stage": "sft"},
        {"rollout_id": 1, "stage": "sft"},
        {"rollout_id": 0, "stage": "rl"},
        {"rollout_id": 1, "stage": "rl"},
        {"other": 1},
    ]
    assert global_steps(recs) == [0, 1, 2, 3, None]
