"""Reproducible runs, offload and profiling, with real processes (Ray actors, an engine server, the
trainer), three runs in the session's shared Ray cluster (each with its own actors and engine: a
run's processes start fresh, as under `slime train`):
- two runs with the same seeds under --deterministic-mode write the same metrics.jsonl, byte for
  byte, timings aside, though one offloads both sides (--colocate's default: --offload-train,
  --offload-rollout) and the other neither: same seeds give the same run, and the optimizer state
  came back exactly each step, across a checkpoint save;
- the offloaded bytes are AdamW's state, counted from the model;
- another --rollout-seed samples other tokens;
- --use-pytorch-profiler writes torch traces that parse as Chrome trace JSON."""

import contextlib
import gzip
import io
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
        "3",
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
        "--eval-interval",  # slime evaluates on an interval only
        "3",
        "--eval-prompt-data",
        "arith",
        str(task_dir / "eval.jsonl"),
        "--eval-temperature",
        "1.0",
        "--save-interval",
        "2",
        "--run-dir",
        str(run_dir),
        "--save",
        str(run_dir / "ckpt"),
        *extra,
    ]


def _run(argv: list[str]) -> str:
    """One run in this process; what it printed."""
    from slime.arguments import parse_args
    from slime.train import train

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        train(parse_args(argv))
    return out.getvalue()


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _timing(key: str) -> bool:
    return key.startswith("perf/") or "time" in key.rsplit("/", 1)[-1]


def _without_timings(row: dict) -> str:
    """The row as metrics.jsonl holds it (JSON), less what a clock measured."""
    return json.dumps({k: v for k, v in row.items() if not _timing(k)}, sort_keys=True)


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny_model_dir, task_dir, tmp_path_factory):
    """Two runs with the same seeds (a offloads both sides, b neither); a third with another
    --rollout-seed, traced by the profiler; and what run a printed."""
    a, b, c = (tmp_path_factory.mktemp(name) for name in ("same_a", "same_b", "other_seed"))
    seeds = ["--seed", "7", "--rollout-seed", "11"]
    out_a = _run(_argv(tiny_model_dir, task_dir, a, *seeds))
    _run(_argv(tiny_model_dir, task_dir, b, *seeds, "--no-offload-train", "--no-offload-rollout"))
    profiled = ["--use-pytorch-profiler", "--profile-step-start", "1", "--profile-step-end", "2"]
    profiled += ["--profile-target", "train_actor", "train_log_probs"]
    _run(_argv(tiny_model_dir, task_dir, c, "--seed", "7", "--rollout-seed", "12", *profiled))
    return a, b, c, out_a


def test_same_seeds_write_the_same_metrics_with_and_without_offload(runs):
    a, b, _, _ = runs
    rows_a, rows_b = _rows(a), _rows(b)
    assert [r["rollout_id"] for r in rows_a] == [0, 1, 2, 3]  # eval before training, then one row per rollout
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
    assert not any("perf/train_offload_bytes" in r for r in rows_b)
    assert json.loads((a / "args.json").read_text())["offload_train"] is True
    assert json.loads((b / "args.json").read_text())["offload_train"] is False
    assert (a / "ckpt" / "iter_0000001").is_dir()  # a save came between offloaded steps


def test_the_offloaded_bytes_are_adams_two_moments_and_steps(runs, tiny_model_dir):
    """AdamW's state per parameter tensor: exp_avg and exp_avg_sq (fp32, its size each) and a
    float32 step: the reference is counted from the model itself. The file is gone after onload."""
    from transformers import AutoModelForCausalLM

    a, _, _, stdout = runs
    params = list(AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters())
    expected = sum(2 * 4 * p.numel() + 4 for p in params)
    rows = _rows(a)[1:]  # the training steps (row 0: the eval before training)
    for r in rows:
        assert r["perf/train_offload_bytes"] == expected
        assert r["perf/train_rss_after"] <= r["perf/train_rss_before"]
    assert all(r["perf/train_onload_bytes"] == expected for r in rows[1:])  # restored before steps 2 and 3
    # the last step's state was offloaded when the run ended: its unnamed file went with the process
    assert list((a / "offload").iterdir()) == []
    print(f"\ntrainer RSS around --offload-train (tiny model, {expected / 1e6:.2f} MB of optimizer state):")
    for r in rows:
        print(
            f"  step {r['rollout_id']}: {r['perf/train_rss_before'] / 2**20:.1f} MiB -> "
            f"{r['perf/train_rss_after'] / 2**20:.1f} MiB in {r['perf/train_offload_time'] * 1e3:.1f} ms"
        )
    assert "[slime] placement" in stdout and "trainer rank 0: node" in stdout and "engine 0: node" in stdout


def test_another_rollout_seed_samples_other_tokens(runs):
    a, _, c, _ = runs
    rows_a, rows_c = _rows(a), _rows(c)
    assert len(rows_a) == len(rows_c)
    keys = ("rollout/raw_reward", "rollout/response_len/mean", "train/pg_loss")
    assert [[r[k] for k in keys] for r in rows_a[1:]] != [[r[k] for k in keys] for r in rows_c[1:]]


def _trace_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        trace = json.load(f)  # Chrome trace format: what Perfetto / chrome://tracing / TensorBoard read
    return trace["traceEvents"]


def test_profiler_writes_chrome_traces_of_the_profiled_steps(runs):
    _, _, c, _ = runs
    tb = c / "tensorboard"  # --tensorboard-dir's default
    actor = sorted(tb.glob("train_actor_rank_0_step_*.pt.trace.json.gz"))
    log_probs = sorted(tb.glob("train_log_probs_rank_0_step_*.pt.trace.json.gz"))
    # --profile-step-start 1 --profile-step-end 2: only the second training step (of three) is traced
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
