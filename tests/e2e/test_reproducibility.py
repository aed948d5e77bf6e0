"""Reproducible runs and profiling, with real processes (Ray actors, an engine server, the trainer),
three runs in the session's shared Ray cluster (each with its own actors and engine: a run's
processes start fresh, as under `slime train`): two runs with the same seeds under
--deterministic-mode write the same metrics.jsonl, byte for byte, timings aside; another
--rollout-seed samples other tokens; and --use-pytorch-profiler writes torch traces that parse as
Chrome trace JSON."""

import gzip
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


def _argv(tiny_model_dir, task_dir, run_dir, *extra) -> list[str]:
    return [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(task_dir / "train.jsonl"),
        "--input-key",
        "prompt",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-shuffle",
        "--rm-type",
        "math",
        "--custom-rm-path",
        "tests.e2e.hooks.digit_reward",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--rollout-max-response-len",
        "8",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--lr",
        "1e-3",
        "--colocate",
        "--check-weight-update-equal",
        "--deterministic-mode",
        "--eval-prompt-data",
        "arith",
        str(task_dir / "eval.jsonl"),
        "--eval-temperature",
        "1.0",
        "--run-dir",
        str(run_dir),
        *extra,
    ]


def _run(argv: list[str]) -> None:
    from slime.arguments import parse_args
    from slime.train import train

    train(parse_args(argv))


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _timing(key: str) -> bool:
    return key.startswith("perf/") or "time" in key.rsplit("/", 1)[-1]


def _without_timings(row: dict) -> str:
    """The row as metrics.jsonl holds it (JSON), less what a clock measured."""
    return json.dumps({k: v for k, v in row.items() if not _timing(k)}, sort_keys=True)


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    """Two runs with the same seeds; a third with another --rollout-seed, traced by the profiler."""
    a, b, c = (tmp_path_factory.mktemp(name) for name in ("same_a", "same_b", "other_seed"))
    _run(_argv(tiny_model_dir, task_dir, a, "--seed", "7", "--rollout-seed", "11"))
    _run(_argv(tiny_model_dir, task_dir, b, "--seed", "7", "--rollout-seed", "11"))
    _run(
        _argv(
            tiny_model_dir,
            task_dir,
            c,
            "--seed",
            "7",
            "--rollout-seed",
            "12",
            "--use-pytorch-profiler",
            "--profile-step-start",
            "1",
            "--profile-step-end",
            "2",
            "--profile-target",
            "train_actor",
            "train_log_probs",
        )
    )
    return a, b, c


def test_same_seeds_write_the_same_metrics(runs):
    a, b, _ = runs
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r["rollout_id"] for r in rows_a] == [0, 1, 2]  # eval before training, then one row per rollout
    for key in (
        "rollout/raw_reward",
        "rollout/response_len/mean",
        "train/pg_loss",
        "train/grad_norm",
        "train/train_rollout_logprob_abs_diff",
        "perf/rollout_time",
    ):
        assert key in rows_a[1], key
    assert "eval/arith" in rows_a[0] and "eval/arith" in rows_a[-1]
    assert [_without_timings(r) for r in rows_a] == [_without_timings(r) for r in rows_b]
    assert rows_a[1]["perf/rollout_time"] != rows_b[1]["perf/rollout_time"]  # the clock is not reproduced


def test_another_rollout_seed_samples_other_tokens(runs):
    a, _, c = runs
    rows_a, rows_c = _rows(a), _rows(c)
    assert len(rows_a) == len(rows_c)
    keys = ("rollout/raw_reward", "rollout/response_len/mean", "train/pg_loss")
    assert [[r[k] for k in keys] for r in rows_a[1:]] != [[r[k] for k in keys] for r in rows_c[1:]]


def _trace_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)  # Chrome trace format: what Perfetto / chrome://tracing / TensorBoard read
    return trace["traceEvents"]


def test_profiler_writes_chrome_traces_of_the_profiled_steps(runs):
    _, _, c = runs
    tb = c / "tensorboard"  # --tensorboard-dir's default
    actor = sorted(tb.glob("train_actor_rank_0_step_*.pt.trace.json.gz"))
    log_probs = sorted(tb.glob("train_log_probs_rank_0_step_*.pt.trace.json.gz"))
    # --profile-step-start 1 --profile-step-end 2: only the second training step (of two) is traced
    assert [p.name.split(".")[0] for p in actor] == ["train_actor_rank_0_step_1"]
    assert [p.name.split(".")[0] for p in log_probs] == ["train_log_probs_rank_0_step_1"]
    events = _trace_events(actor[0])
    ops = {e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    assert "aten::mm" in ops and any(name.endswith("Backward0") for name in ops)  # forward and backward
    # --global-batch-size 8 of 16 samples: two optimizer steps in the traced rollout
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"] == "Optimizer.step#AdamW.step"]
    assert len(steps) == 2
    lp_events = _trace_events(log_probs[0])
    lp_ops = {e["name"] for e in lp_events if e.get("cat") == "cpu_op"}
    assert {"aten::mm", "aten::logsumexp"} <= lp_ops
    assert not any(name.endswith("Backward0") for name in lp_ops)  # forward passes only
    assert not any(e.get("cat") == "user_annotation" for e in lp_events)  # no optimizer
    assert not list(tb.glob("train_overall*"))
